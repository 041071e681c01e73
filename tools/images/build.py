"""Builds the real-node tier's images into ~/.cache/sidecarctl/images (each only on a cache miss):
the busybox test images (app, sidecar v1/v2, a SIGTERM-ignoring sidecar, pause), the busybox
stand-ins for config/samples' images (the demo on a real node), the Debian bookworm + Python 3.11
base, and the manager image from the repository's Dockerfile.

    python tools/images/build.py          # all of them; one line per image on stderr
    python tools/images/build.py --print  # also print the archive paths on stdout

tools/setup-node.sh runs this as root, so a test run only imports the archives. The recipes are in
tests/kube/images.py and tests/kube/managerimage.py, where the node fixture also uses them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.kube import images, managerimage  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the archive paths on stdout")
    args = parser.parse_args()
    started = time.monotonic()
    test_images = images.busybox_archive()
    print(f"test images: {test_images} ({time.monotonic() - started:.1f}s)", file=sys.stderr)
    sample_images = images.samples_archive()
    print(f"sample stand-in images: {sample_images}", file=sys.stderr)
    try:
        base = managerimage.base_archive()
        print(f"base image: {base.archive} ({base.seconds:.1f}s, {base.size / 2**20:.0f} MiB)", file=sys.stderr)
        manager = managerimage.manager_archive()
    except managerimage.ImageBuildError as e:
        print(f"image build failed: {e}", file=sys.stderr)
        return 1
    state = "cached" if manager.cached else f"built in {manager.seconds:.1f}s"
    print(f"manager image {manager.ref}: {manager.archive} ({state}, {manager.size / 2**20:.0f} MiB)", file=sys.stderr)
    if args.print:
        print("\n".join(str(p) for p in (test_images, sample_images, base.archive, manager.archive)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
