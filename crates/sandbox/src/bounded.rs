//! Every reader of a file has a size limit: the one bounded read that every file the host takes
//! (operator files, components, tokens) goes through. The bottom layer: it imports nothing of
//! the crate.

use std::path::{Path, PathBuf};

/// Why a file's bytes could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: larger than {limit} bytes, the most this input may be")]
    TooLarge { path: PathBuf, limit: u64 },
}

/// Reads at most `limit` bytes of `path`: a longer file (or a device that never ends) is
/// [`ReadError::TooLarge`] after `limit + 1` bytes, whatever its size says.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    use std::io::Read as _;
    let error = |source| ReadError::Io { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(error)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(error)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { path: path.to_owned(), limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_file_longer_than_its_limit_is_refused_after_the_limit_not_read_to_its_end() {
        let err = read(Path::new("/dev/zero"), 4_096).unwrap_err();
        assert!(matches!(err, ReadError::TooLarge { limit: 4_096, .. }), "{err}");
    }
}
