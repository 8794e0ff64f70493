"""The default image of container workspaces (`envs.workspace.image`), built from Debian's packages with no
image registry: `make env-image`, or `python -m rollart.sandbox.image [--engine podman|docker]`.

In: a container engine's CLI, `debootstrap` and root (to make a Debian root file system), and a Debian mirror —
read from this machine's own apt sources (`/etc/apt/sources.list.d/*.sources`, `/etc/apt/sources.list`) unless
given (`--mirror`). Out: the image `IMAGE` in the engine's local store, labelled with the hash of its recipe.

The recipe: `debootstrap --variant=minbase` of `SUITE` with `PACKAGES` (python3 and git; minbase brings bash,
coreutils' `timeout`, tar and realpath, which the container backend runs), apt's caches emptied, then
`<engine> import` of the tree. What a workspace command finds there is what the native sandbox gives it: a
Debian userland with Python 3.

Cached: `ensure` builds only when the engine has no `IMAGE` whose `rollart.recipe` label is this recipe's hash,
so the image is rebuilt exactly when `SUITE`, `PACKAGES` or `RECIPE_VERSION` change (a minute or two; ~280 MB).
Why debootstrap rather than a Dockerfile: no registry holds a base image on the machines rollart is built on,
and Debian's own tool makes a root file system from its package mirror alone.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IMAGE = "localhost/rollart-env:bookworm"  # envs.workspace.image's default (a unit test keeps them equal)
SUITE = "bookworm"
PACKAGES = ("python3-minimal", "python3", "git")
RECIPE_VERSION = 1  # bump when the steps below change in a way the other fields do not show
LABEL = "rollart.recipe"
BUILD_TIMEOUT_S = 1800


class ImageBuildError(RuntimeError):
    """The image could not be built; the message says what is missing."""


def recipe_hash() -> str:
    """What the image is built from, hashed: its label."""
    recipe = {"suite": SUITE, "packages": sorted(PACKAGES), "version": RECIPE_VERSION, "variant": "minbase"}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def apt_mirror(sources: list[Path] | None = None) -> str:
    """The Debian mirror this machine's apt uses (the `URIs:` of a deb822 source naming `SUITE`, or a
    one-line `deb URL SUITE` entry); ImageBuildError when none is found."""
    if sources is None:
        sources = [Path(p) for p in sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))]
        sources += [Path("/etc/apt/sources.list"), *map(Path, sorted(glob.glob("/etc/apt/sources.list.d/*.list")))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() and SUITE in fields.get("Suites", "").split():
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    url, suite = [p for p in parts[1:] if not p.startswith("[")][:2]
                    if suite == SUITE:
                        return url
    raise ImageBuildError(f"no Debian {SUITE} mirror in this machine's apt sources; pass --mirror URL")


def current_label(engine: str, image: str = IMAGE) -> str | None:
    """The recipe label of `image` in the engine's store; None when there is no such image."""
    try:
        out = subprocess.run([engine, "image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def build(engine: str, mirror: str | None = None, image: str = IMAGE) -> None:
    """Build `image` with `engine` (see the module docstring); ImageBuildError naming what failed."""
    if shutil.which(engine) is None:
        raise ImageBuildError(f"no `{engine}` command: install it (Debian: apt-get install podman runc)")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("no `debootstrap` command: install it (Debian: apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap makes a root file system: build the image as root")
    mirror = mirror or apt_mirror()
    root = Path(tempfile.mkdtemp(prefix="rollart-image-", dir="/var/tmp"))
    try:
        print(f"==> debootstrap {SUITE} ({', '.join(PACKAGES)}) from {mirror}", flush=True)
        run = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                              str(root), mirror], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if run.returncode != 0:
            raise ImageBuildError(f"debootstrap failed ({run.returncode}): {(run.stderr or run.stdout)[-1500:]}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        print(f"==> {engine} import as {image}", flush=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run([engine, "import", "--change", f"LABEL {LABEL}={recipe_hash()}", "-", image],
                                      stdin=tar.stdout, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait(timeout=60)
        if imported.returncode != 0:
            raise ImageBuildError(f"{engine} import failed: {imported.stderr[-1500:]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def ensure(engine: str, mirror: str | None = None, image: str = IMAGE) -> bool:
    """Build `image` unless the engine holds one of this recipe; True when it built."""
    if current_label(engine, image) == recipe_hash():
        return False
    build(engine, mirror, image)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollart.sandbox.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="podman", choices=["podman", "docker"])
    parser.add_argument("--mirror", help="a Debian mirror URL (default: the one this machine's apt uses)")
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")
    args = parser.parse_args(argv)
    try:
        if args.force:
            build(args.engine, args.mirror, args.image)
            built = True
        else:
            built = ensure(args.engine, args.mirror, args.image)
    except (ImageBuildError, subprocess.TimeoutExpired) as exc:
        print(f"rollart: the environment image was not built: {exc}", file=sys.stderr)
        return 1
    print(f"==> {args.image} {'built' if built else 'is up to date'} (recipe {recipe_hash()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
