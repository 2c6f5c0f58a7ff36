"""``python -m clb_reconciler replay TRACE... --component FILE [--swap-component NAME=FILE]...
[--json] [--all-divergences]``"""

import sys


def main() -> int:
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(
            "usage: python -m clb_reconciler replay TRACE... --component FILE "
            "[--swap-component NAME=FILE]... [--json] [--all-divergences]\n"
        )
        return 0 if argv else 2
    if argv[0] != "replay":
        sys.stderr.write(f"python -m clb_reconciler: unknown command `{argv[0]}` (the only one is `replay`)\n")
        return 2
    from .replay import main as replay_main

    return replay_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
