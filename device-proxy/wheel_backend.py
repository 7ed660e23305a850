"""The PEP 517 backend of the `ec-proxy` wheel: maturin's, plus ec_protocol.

maturin builds the wheel (pyproject.toml beside this file): the core's binding
`ec_patch` compiled from edit-patch/python, and `ec_proxy` (python-packages).
maturin places Python files only from below python-source, and ec_protocol
lives in protocol/python, so the packages listed in
`[tool.edgecourier.wheel] extra-packages` are added here to the wheel maturin
wrote, each file with its RECORD line. Nothing in the source tree is written or
linked, so a fresh clone builds the same wheel (`make wheel`, or
`pip install device-proxy/`).

Not supported: an sdist (it would have to carry ../protocol) and editable
installs (the checkout's own flow is the .pth that `make setup` writes).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import tempfile
import tomllib
import zipfile
from pathlib import Path

import maturin
from maturin import get_requires_for_build_wheel, prepare_metadata_for_build_wheel

__all__ = ["build_wheel", "build_sdist", "get_requires_for_build_wheel", "prepare_metadata_for_build_wheel"]

HERE = Path(__file__).resolve().parent


def extra_packages() -> list[Path]:
    """The package folders of `[tool.edgecourier.wheel] extra-packages`, checked."""
    with open(HERE / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    names = config.get("tool", {}).get("edgecourier", {}).get("wheel", {}).get("extra-packages", [])
    packages = []
    for name in names:
        package = (HERE / name).resolve()
        if not (package / "__init__.py").is_file():
            raise RuntimeError(f"ec-proxy wheel: extra package {name} is not a Python package at {package} "
                               "(the wheel is built from a checkout of the whole repository)")
        packages.append(package)
    return packages


def package_files(package: Path) -> list[tuple[str, Path]]:
    """(name in the wheel, file) for every file of the package, subpackages included,
    but not byte code or native libraries left by a checkout's runs."""
    files = []
    for path in sorted(package.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo", ".so"):
            continue
        files.append((path.relative_to(package.parent).as_posix(), path))
    return files


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def add_packages(wheel: Path, packages: list[Path]) -> None:
    """Rewrite `wheel` with the packages' files added and RECORD updated."""
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        records = [i for i in infos if i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise RuntimeError(f"ec-proxy wheel: {wheel.name} has {len(records)} RECORD files")
        record = records[0]
        present = {i.filename for i in infos}
        rows = [row for row in csv.reader(io.StringIO(src.read(record).decode())) if row and row[0] != record.filename]
        tmp = wheel.with_name(wheel.name + ".part")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in infos:
                if info is not record:
                    dst.writestr(info, src.read(info))
            for package in packages:
                for name, path in package_files(package):
                    if name in present:
                        raise RuntimeError(f"ec-proxy wheel: {name} is already in the wheel maturin built")
                    data = path.read_bytes()
                    info = zipfile.ZipInfo(name, date_time=record.date_time)
                    info.external_attr = 0o644 << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    dst.writestr(info, data)
                    rows.append([name, record_hash(data), str(len(data))])
            rows.append([record.filename, "", ""])
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(rows)
            dst.writestr(record, out.getvalue())
    os.replace(tmp, wheel)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    packages = extra_packages()
    # maturin writes its wheel to --out and the shim copies it to wheel_directory: keep
    # the incomplete one out of target/wheels, where it would look like the real one.
    with tempfile.TemporaryDirectory(prefix="ec-proxy-maturin-") as out:
        args = maturin.get_maturin_pep517_args(config_settings) + ["--out", out]
        name = maturin.build_wheel(wheel_directory, {**(config_settings or {}), "build-args": args}, metadata_directory)
    add_packages(Path(wheel_directory) / name, packages)
    return name


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("ec-proxy: no sdist (the wheel takes ec_protocol from ../protocol/python); "
                       "build the wheel from a checkout: `make wheel`")
