"""Re-zip an office document with another ZIP writer and deflater, keeping
its members, their order, names, times and which are stored: Info-ZIP
`zip`, 7-Zip, Go's archive/zip, and Rust's flate2 (miniz_oxide and zlib-rs
backends). The writers are real programs: the system's `zip` and `7zz`, and
the Go and Rust re-zippers of experiments/bench/rezip/, built here on first
use into target/rezip/ (Go: golang-go; Rust: cargo, crates.io the first
time). Used by experiments/bench/byte_goals.py and by the end-to-end tests
of documents written by deflaters other than zlib."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REZIP = os.path.join(REPO, "experiments", "bench", "rezip")
REZIP_TARGET = os.path.join(REPO, "target", "rezip")
DEFLATERS = ("info-zip", "7zip", "go", "flate2-miniz", "flate2-zlib-rs")

# Packages to name when a tool is missing (Debian bookworm).
PACKAGES = {"zip": "zip", "7z": "7zip (or p7zip-full)", "go": "golang-go",
            "cargo": "a Rust toolchain (rustup; `make setup`)"}


class RezipError(Exception):
    """A writer is missing, failed, or changed the document."""


def progress(message):
    print(message, file=sys.stderr, flush=True)


def need(name, candidates=None, packages=None):
    """The path of `name` (or the first of `candidates` found), or an error
    naming the Debian package (from `packages`, else this module's)."""
    for candidate in candidates or (name,):
        path = shutil.which(candidate)
        if path:
            return path
    raise RezipError(f"`{'` or `'.join(candidates or (name,))}` not found on PATH: install the "
                     f"Debian package {(packages or PACKAGES)[name]}")


def run(command, cwd=None, env=None):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RezipError(f"{' '.join(map(str, command))} failed ({result.returncode}):\n"
                         f"{result.stdout[-2000:]}{result.stderr[-3000:]}")
    return result.stdout


def build(deflaters):
    """{deflater: command prefix taking LIST DIR OUT}; builds the Go and Rust writers."""
    tools = {}
    os.makedirs(REZIP_TARGET, exist_ok=True)
    if "go" in deflaters:
        go = need("go")
        out = os.path.join(REZIP_TARGET, "rezip-go")
        progress("building the Go re-zipper (experiments/bench/rezip/go)")
        env = dict(os.environ, GOFLAGS="-mod=mod", GOCACHE=os.path.join(REZIP_TARGET, "gocache"))
        run(["nice", go, "build", "-o", out, "."], cwd=os.path.join(REZIP, "go"), env=env)
        tools["go"] = [out]
    for backend in ("miniz", "zlib-rs"):
        name = f"flate2-{backend}"
        if name not in deflaters:
            continue
        cargo = need("cargo")
        target = os.path.join(REZIP_TARGET, backend)
        progress(f"building the Rust re-zipper on flate2 ({backend} backend) into {target}")
        run(["nice", cargo, "build", "--quiet", "--release", "--manifest-path",
             os.path.join(REZIP, "rust", "Cargo.toml"), "--target-dir", target,
             "--no-default-features", "--features", backend])
        tools[name] = [os.path.join(target, "release", "rezip-flate2")]
    return tools


def unpack(src, folder):
    """Unpack src into folder (file times as in the ZIP); write LIST; return its path."""
    lines = []
    with zipfile.ZipFile(src) as archive:
        for info in archive.infolist():
            mtime = int(time.mktime(info.date_time + (0, 0, -1)))
            path = os.path.join(folder, info.filename)
            if info.is_dir():
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as file:
                    file.write(archive.read(info))
                os.utime(path, (mtime, mtime))
            lines.append((info.compress_type, mtime, info.filename))
    listing = os.path.join(folder, "..", os.path.basename(folder) + ".list")
    with open(listing, "w", encoding="utf-8") as file:
        file.writelines(f"{m}\t{t}\t{n}\n" for m, t, n in lines)
    return listing, lines


def rezip(deflater, tools, src, out, work):
    """Re-zip the document src with `deflater` into out, member order kept."""
    folder = os.path.join(work, os.path.basename(out) + ".d")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    listing, lines = unpack(src, folder)
    if os.path.exists(out):
        os.remove(out)
    out = os.path.abspath(out)
    if deflater in tools:
        run([*tools[deflater], listing, folder, out])
    else:
        # Info-ZIP and 7-Zip add names in the order given; stored members
        # (ODF's mimetype) go in first, in a run of their own.
        groups = []
        for method, _, name in lines:
            stored = method == zipfile.ZIP_STORED
            if not groups or groups[-1][0] != stored:
                groups.append((stored, []))
            groups[-1][1].append(name)
        for stored, names in groups:
            if deflater == "info-zip":
                command = [need("zip"), "-q", "-X", "-0" if stored else "-6", out, *names]
            else:
                command = [need("7z", ("7zz", "7z", "7za")), "a", "-tzip", "-bso0", "-bsp0",
                           "-mm=Copy" if stored else "-mm=Deflate", "-mx=5", out, *names]
            run(command, cwd=folder)
    shutil.rmtree(folder)
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(out) as b:
        names_a = [i.filename for i in a.infolist()]
        names_b = [i.filename for i in b.infolist()]
        # 7-Zip sorts the members by name whatever order it is given them in
        # (ODF's mimetype then is no longer first); the others keep the order.
        if (sorted(names_a) if deflater == "7zip" else names_a) != \
                (sorted(names_b) if deflater == "7zip" else names_b):
            raise RezipError(f"{deflater} changed the members or their order of {src}:\n"
                             f"{names_a}\n{names_b}")
        if any(a.read(n) != b.read(n) for n in names_a if not n.endswith("/")):
            raise RezipError(f"{deflater} changed a member's content of {src}")
        if b.testzip():
            raise RezipError(f"{deflater} wrote a bad CRC in {out}")
    return out


def rezip_bytes(deflater, tools, data, work):
    """`data` (a document's bytes) re-zipped with `deflater`, as bytes."""
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "src.zip")
    with open(src, "wb") as file:
        file.write(data)
    out = rezip(deflater, tools, src, os.path.join(work, f"out-{deflater}.zip"), work)
    with open(out, "rb") as file:
        return file.read()
