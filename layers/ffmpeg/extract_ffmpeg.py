"""Copies the aarch64 ffmpeg out of the imageio-ffmpeg wheel in WHEELS to OUT.

Usage: python3 extract_ffmpeg.py WHEELS OUT

Fails, naming what it found, unless the wheels folder holds exactly one
imageio-ffmpeg wheel with exactly one Linux aarch64 ffmpeg in it: a changed
pin or package layout must stop the build, not ship the wrong binary.
"""

import os
import pathlib
import shutil
import sys
import zipfile


def main(wheels: str, out: str) -> None:
    found = sorted(pathlib.Path(wheels).glob("imageio_ffmpeg-*.whl"))
    if len(found) != 1:
        sys.exit(f"expected one imageio-ffmpeg wheel in {wheels}, found {[p.name for p in found]}")
    with zipfile.ZipFile(found[0]) as wheel:
        binaries = [
            n for n in wheel.namelist() if n.startswith("imageio_ffmpeg/binaries/ffmpeg-linux-aarch64")
        ]
        if len(binaries) != 1:
            sys.exit(f"expected one aarch64 ffmpeg in {found[0].name}, found {binaries}")
        partial = out + ".partial"
        with wheel.open(binaries[0]) as source, open(partial, "wb") as target:
            shutil.copyfileobj(source, target, 1 << 20)
    os.chmod(partial, 0o755)
    os.replace(partial, out)
    print(f"{out}: {binaries[0].rsplit('/', 1)[1]} from {found[0].name}, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
