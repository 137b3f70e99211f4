"""Download, on this machine, the wheels the GPU device machine lacks, for ``benchmarks/device_run.sh``.

The device machine (docs/levels.md, "The GPU device run") has no network: Python 3.12 on manylinux x86-64
with CUDA torch 2.11.0, transformers 5.17.0 and the packages of :data:`IMAGE`. What the gate needs beyond
them travels as wheels in one git-ignored folder (``.device-wheels/``) beside the working tree, 64 MiB in
all with the tracked files. This script:

1. downloads :data:`WANTED` (mindstudio-probe, jsonschema, zstandard, transformers at the goldens'
   version) with ``pip download --no-deps --only-binary=:all:`` for cp312 manylinux x86-64, each at the
   version ``constraints/cpu.txt`` pins (the environment the CPU goldens were recorded in);
2. reads every downloaded wheel's ``Requires-Dist`` (markers evaluated for CPython 3.12 on Linux x86-64,
   extras left out) and adds each requirement the image cannot meet: a package not in :data:`IMAGE`, or
   one whose image version (where known) falls outside the specifier (transformers 5.10.4 needs
   ``tokenizers<=0.23.0``; the image has 0.23.2). Repeats until nothing is missing;
3. removes wheels of the folder that are no longer wanted (two versions of one package stop the install),
   prints each wheel's size, the folder's total, the tracked tree's size (``git ls-files``) and what is
   left of the 64 MiB, and exits 1 when the two together exceed it.

Never torch or ray (:data:`NEVER`): torch is the machine's own CUDA build, and Ray's wheel alone is over
the limit (so multi-rank and verl scenarios stay off the device run).

Usage: python benchmarks/device_wheels.py [--dest .device-wheels] [--constraints constraints/cpu.txt]
Exit codes: 0 done, 1 over the size limit or a requirement that cannot be met, 2 bad arguments or a
package with no pin in the constraints file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parent.parent
#: what the gate needs on the device machine beyond its image (the goldens' transformers, so key sets match)
WANTED = ("mindstudio-probe", "jsonschema", "zstandard", "transformers")
#: never carried: the machine's CUDA torch must stay; Ray's wheel alone exceeds the 64 MiB
NEVER = frozenset({"torch", "ray"})
#: the device image's Python packages as the device tool's machine notes listed them on 2026-11-17, with the
#: version where that page gives one; None: present, version not recorded (taken as meeting any specifier)
IMAGE: dict[str, str | None] = {
    **dict.fromkeys(
        [
            "absl-py",
            "accelerate",
            "attrs",
            "certifi",
            "charset-normalizer",
            "click",
            "cloudpickle",
            "colorama",
            "contourpy",
            "cycler",
            "einops",
            "filelock",
            "fonttools",
            "fsspec",
            "h11",
            "h5py",
            "hf-xet",
            "httpcore",
            "httpx",
            "idna",
            "iniconfig",
            "jinja2",
            "joblib",
            "kiwisolver",
            "markdown",
            "markdown-it-py",
            "markupsafe",
            "matplotlib",
            "mdurl",
            "ml-dtypes",
            "mpmath",
            "networkx",
            "onnx",
            "packaging",
            "pandas",
            "pillow",
            "pip",
            "pluggy",
            "protobuf",
            "psutil",
            "pygments",
            "pyparsing",
            "pytest",
            "pytest-xdist",
            "python-dateutil",
            "pyyaml",
            "regex",
            "requests",
            "rich",
            "scikit-learn",
            "scipy",
            "setuptools",
            "shellingham",
            "six",
            "sympy",
            "tensorboard",
            "tensorboard-data-server",
            "threadpoolctl",
            "tqdm",
            "typer",
            "typing-extensions",
            "urllib3",
            "werkzeug",
            "wheel",
        ]
    ),
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
#: the device machine's interpreter, for evaluating requirement markers
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
LIMIT = 64 * 2**20


@dataclass(frozen=True)
class Wheel:
    """One downloaded wheel: its canonical name, version, file and ``Requires-Dist`` lines."""

    name: str
    version: str
    path: Path
    requires: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Wheel:
        name, version, _, _ = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as archive:
            meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            text = archive.read(meta).decode("utf-8")
        prefix = "Requires-Dist:"
        requires = tuple(line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix))
        return cls(str(name), str(version), path, requires)


def pins(constraints: Path) -> dict[str, str]:
    """``{canonical name: version}`` of every ``name==version`` line of a pip constraints file."""
    out = {}
    for line in constraints.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            out[canonicalize_name(name)] = version.strip()
    return out


def unmet(wheels: dict[str, Wheel]) -> dict[str, str]:
    """``{requirement name: why}`` for each runtime requirement of ``wheels`` that neither the folder nor
    the image meets (the image's version checked where :data:`IMAGE` records it)."""
    missing = {}
    for wheel in wheels.values():
        for line in wheel.requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(MARKERS):
                continue
            name = canonicalize_name(req.name)
            have = wheels[name].version if name in wheels else IMAGE.get(name, "")
            if name in wheels and have not in req.specifier:
                missing[name] = f"{wheel.name} {wheel.version} needs {req}, the folder has {have}"
            elif name not in wheels and (have == "" or (have is not None and have not in req.specifier)):
                where = "the image lacks it" if have == "" else f"the image has {have}"
                missing[name] = f"{wheel.name} {wheel.version} needs {req}; {where}"
    return missing


def download(names: list[str], versions: dict[str, str], dest: Path) -> None:
    """``pip download`` ``names`` at their pinned versions for CPython 3.12 manylinux x86-64, no dependencies.

    Raises:
        SystemExit(2): a name has no pin in the constraints file, or is one of :data:`NEVER`.
    """
    specs = []
    for name in names:
        if name in NEVER:
            raise SystemExit(f"device_wheels: {name} would have to travel; it never does (see the module docstring)")
        if name not in versions:
            raise SystemExit(
                f"device_wheels: constraints/cpu.txt has no '{name}==<version>' line; pin it (make lock) and rerun"
            )
        specs.append(f"{name}=={versions[name]}")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platforms]
    subprocess.run([*command, "--dest", str(dest), *specs], check=True)


def resolve(dest: Path, versions: dict[str, str]) -> dict[str, Wheel]:
    """Download :data:`WANTED` and then each unmet requirement until none is left; the wanted wheels by name.

    Raises:
        SystemExit(1): a requirement stays unmet by the pinned version (the pin contradicts a specifier).
    """
    wanted, tried = list(WANTED), set()
    while True:
        download([n for n in wanted if n not in tried], versions, dest)
        tried.update(wanted)
        found = {w.name: w for w in map(Wheel.read, sorted(dest.glob("*.whl"))) if w.version == versions.get(w.name)}
        wheels = {n: found[n] for n in wanted if n in found}
        missing = unmet(wheels)
        stuck = [f"{n}: {why}" for n, why in missing.items() if n in tried]
        if stuck:
            raise SystemExit("device_wheels: cannot meet " + "; ".join(stuck))
        if not missing:
            return wheels
        for name, why in missing.items():
            print(f"adding {name}=={versions.get(name, '?')} ({why})")
        wanted += list(missing)


def tracked_bytes(repo: Path) -> int:
    """Bytes of the files git tracks in ``repo`` (the working tree that travels with the wheels)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=repo, check=True, capture_output=True).stdout
    return sum((repo / n).stat().st_size for n in names.decode().split("\0") if n and (repo / n).is_file())


def report(wheels: dict[str, Wheel], dest: Path, repo: Path) -> int:
    """Remove stray wheels, print the sizes; 1 when wheels and tracked tree exceed :data:`LIMIT`, else 0."""
    keep = {w.path for w in wheels.values()}
    for stray in dest.glob("*.whl"):
        if stray not in keep:
            stray.unlink()
    total = sum(w.path.stat().st_size for w in wheels.values())
    for w in sorted(wheels.values(), key=lambda w: -w.path.stat().st_size):
        print(f"{w.path.stat().st_size / 2**20:8.2f} MiB  {w.path.name}")
    tracked = tracked_bytes(repo)
    left = LIMIT - tracked - total
    print(f"{total / 2**20:8.2f} MiB  {len(wheels)} wheels in {dest}")
    print(f"{tracked / 2**20:8.2f} MiB  tracked files (git ls-files)")
    print(f"{left / 2**20:8.2f} MiB  left of the device tool's 64 MiB")
    if left < 0:
        print("device_wheels: wheels and tracked files exceed 64 MiB; carry fewer wheels", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".device-wheels")
    parser.add_argument("--constraints", type=Path, default=REPO / "constraints" / "cpu.txt")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    wheels = resolve(args.dest, pins(args.constraints))
    return report(wheels, args.dest, REPO)


if __name__ == "__main__":
    sys.exit(main())
