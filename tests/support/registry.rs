//! The CNCF distribution registry (Debian's `docker-registry`) on a free loopback port, its
//! storage in a folder of its own; stopped and removed when dropped. Installed on first use by
//! `harness/image/tools.sh`: a registry test that skips itself proves nothing.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct Registry {
    child: Child,
    pub address: SocketAddr,
    dir: PathBuf,
}

/// Installs the registry (and the image's other tools) once per process.
pub fn install_tools() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../harness/image/tools.sh");
        let status = Command::new("bash").arg(&script).stdout(Stdio::null()).status().expect("harness/image/tools.sh");
        assert!(status.success(), "harness/image/tools.sh: {status}");
    });
}

impl Registry {
    /// Starts one with its storage, configuration and log in `dir`.
    pub fn start(dir: PathBuf) -> Registry {
        install_tools();
        let address = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        std::fs::create_dir_all(dir.join("storage")).unwrap();
        std::fs::write(
            dir.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n  secret: clb-registry-test\n",
                dir.join("storage").display()
            ),
        )
        .unwrap();
        // Its log (a HEAD for each blob before the upload is logged as an error) is printed only
        // when the test fails.
        std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = serve(&dir, address);
        Registry { child, address, dir }
    }

    /// Stops it (a registry going away); [`Registry::restart`] brings it back on the same port
    /// with the same storage.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn restart(&mut self) {
        self.stop();
        self.child = serve(&self.dir, self.address);
    }
}

/// `docker-registry serve` of the configuration in `dir`, its log appended to `dir`'s, once it
/// listens on `address`.
fn serve(dir: &Path, address: SocketAddr) -> Child {
    let log = std::fs::OpenOptions::new().append(true).open(dir.join("registry.log")).unwrap();
    let mut child = Command::new("docker-registry")
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("docker-registry");
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(address).is_err() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the registry did not listen on {address} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default();
            eprintln!("the registry's log:\n{log}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
