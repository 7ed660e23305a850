"""The device side under hostile input (issue 8): `ec_patch.apply` of a
hostile patch and `ec_patch.diff` of a hostile download, with a peak-memory
bound.

The hostile document: a ZIP whose `word/document.xml` is a million or more
empty deflate blocks (empty content). Its preflate recipe is a few dozen
bytes; preflate-rs 0.7.6 kept about 100 bytes per block while rebuilding or
analysing it, without bound. Each call runs in a child Python whose peak
resident memory (the kernel's `VmHWM`) is watched while it runs (killed past
the bound) and reported at its end, under a 1 GiB address-space limit (a
small device without overcommit).

Bound: **64 MiB + 2 x the largest document of the case**.
"""

import hashlib
import resource
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import pytest

import ec_patch

MIB = 1 << 20
APPLY_BLOCKS = 1_000_000  # 1.25 MB of data; preflate-rs 0.7.6 rebuilt it in ~105 MB
DIFF_BLOCKS = 2_000_000  # 2.5 MB; analysed by preflate-rs 0.7.6 in several hundred MB
ADDRESS_SPACE = 1 << 30
TYPES = b'<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'


def empty_blocks(n):
    """`n` empty fixed-Huffman deflate blocks (10 bits each), the last one final."""
    assert n >= 1
    group = (2 | 2 << 10 | 2 << 20 | 2 << 30).to_bytes(5, "little")  # four non-final blocks: 40 bits
    full, rest = divmod(n - 1, 4)
    tail = sum(2 << (10 * i) for i in range(rest)) | 3 << (10 * rest)
    return group * full + tail.to_bytes((10 * (rest + 1) + 7) // 8, "little")


def raw_deflate(data):
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def zip_of(members):
    """A ZIP of (name, compressed data, content) members, method 8."""
    out, central = bytearray(), bytearray()
    for name, data, content in members:
        offset = len(out)
        # flags, method, time and date, CRC-32, sizes, name and extra lengths
        fields = struct.pack("<HHIIIIHH", 0x0800, 8, 0x5A216000, zlib.crc32(content), len(data), len(content), len(name), 0)
        out += struct.pack("<IH", 0x04034B50, 20) + fields + name + data
        central += struct.pack("<IHH", 0x02014B50, 20, 20) + fields
        central += struct.pack("<HHHII", 0, 0, 0, 0, offset) + name
    cd = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), cd, 0)
    return bytes(out)


def legit_doc(seed):
    body = b"".join(b"<w:p><w:r><w:t>paragraph %d of %d</w:t></w:r></w:p>" % (i, seed) for i in range(2000))
    doc = b"<w:document><w:body>" + body + b"</w:body></w:document>"
    return zip_of([(b"[Content_Types].xml", raw_deflate(TYPES), TYPES), (b"word/document.xml", raw_deflate(doc), doc)])


def hostile_doc(blocks):
    return zip_of([(b"[Content_Types].xml", raw_deflate(TYPES), TYPES), (b"word/document.xml", empty_blocks(blocks), b"")])


def test_the_generator_writes_valid_deflate():
    for n in (1, 2, 3, 4, 5, 9, 1000):
        d = zlib.decompressobj(-15)
        assert d.decompress(empty_blocks(n)) == b"" and d.eof and d.unused_data == b""


@pytest.fixture(scope="module")
def hostile_patch(request, tmp_path_factory):
    """legit base -> hostile document, its member rebuilt by a preflate recipe,
    made as an attacker would (limits that let diff analyse any stream).
    Cached by pytest (the analysis of a million blocks takes seconds)."""
    base = legit_doc(1)
    # pytest's cache keeps the slow-to-make patch between runs; without it (-p no:cacheprovider), a temporary folder.
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("ec_patch_hostile") if cache else tmp_path_factory.mktemp("ec_patch_hostile")
    path = folder / f"patch-{APPLY_BLOCKS}-{hashlib.sha256(base).hexdigest()[:16]}.ecp"
    if not path.exists():
        # Before issue 8's fix the binding took no limits and diff made the recipe anyway.
        kwargs = {"limits": ec_patch.Limits(preflate_block_allowance=1 << 62)} if hasattr(ec_patch, "Limits") else {}
        patch = ec_patch.diff(base, hostile_doc(APPLY_BLOCKS), verify=False, **kwargs)
        assert ec_patch.inspect(patch)["recipes"].get("preflate", 0) == 1
        path.write_bytes(patch)
    return base, path.read_bytes()


CHILD = textwrap.dedent(
    """
    import sys, ec_patch
    case, folder = sys.argv[1], sys.argv[2]
    read = lambda n: open(f"{folder}/{n}", "rb").read()
    try:
        if case == "apply":
            out = ec_patch.apply(read("base"), read("patch"))
            result = f"ok {len(out)}"
        else:
            base, new = read("base"), read("new")
            patch = ec_patch.diff(base, new)
            recipes = ec_patch.inspect(patch)["recipes"] if ec_patch.inspect(patch)["kind"] == "zip" else {}
            result = f"ok rebuilds={ec_patch.apply(base, patch) == new} preflate={recipes.get('preflate', 0) > 0}"
    except ec_patch.PatchError as e:
        result = f"err {e.code}"
    hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    print("RESULT", result)
    print("HWM", hwm)
    """
)


def vm_hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def run_child(tmp_path, case, files, bound):
    """Runs `case` in a child Python; fails if its peak RSS passes `bound`."""
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    start = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", CHILD, case, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limit)
    killed = None
    while child.poll() is None:
        hwm = vm_hwm(child.pid)
        if killed is None and ((hwm or 0) > bound or time.monotonic() - start > 120):
            child.kill()
            killed = hwm or 0
        time.sleep(0.005)
    out, err = child.communicate()
    assert killed is None, f"{case}: peak RSS passed the bound of {bound / MIB:.1f} MiB (killed at {killed / MIB:.1f} MiB after {time.monotonic() - start:.1f} s)"
    fields = dict(l.split(" ", 1) for l in out.decode().splitlines() if " " in l)
    assert "RESULT" in fields, f"{case}: the child died ({child.returncode}): {err.decode()[-2000:]}"
    peak = int(fields["HWM"])
    print(f"{case}: {fields['RESULT']}; peak RSS {peak / MIB:.1f} MiB (bound {bound / MIB:.1f} MiB), {time.monotonic() - start:.2f} s")
    assert peak <= bound
    return fields["RESULT"]


def bound_for(*docs):
    return 64 * MIB + 2 * max(len(d) for d in docs)


def test_apply_of_a_hostile_patch_is_refused_within_the_bound(tmp_path, hostile_patch):
    base, patch = hostile_patch
    assert len(patch) < 1000
    new_len = len(hostile_doc(APPLY_BLOCKS))
    result = run_child(tmp_path, "apply", {"base": base, "patch": patch}, 64 * MIB + 2 * max(new_len, len(base)))
    assert result == "err limit_exceeded"


def test_diff_of_a_hostile_download_falls_back_to_raw_bytes_within_the_bound(tmp_path):
    base, new = legit_doc(2), hostile_doc(DIFF_BLOCKS)
    assert run_child(tmp_path, "diff", {"base": base, "new": new}, bound_for(base, new)) == "ok rebuilds=True preflate=False"


def test_diff_whose_base_is_the_hostile_download_stays_within_the_bound(tmp_path):
    base = hostile_doc(DIFF_BLOCKS)
    for new in (legit_doc(3), hostile_doc(DIFF_BLOCKS + 1)):
        assert run_child(tmp_path, "diff", {"base": base, "new": new}, bound_for(base, new)).startswith("ok rebuilds=True")


def test_a_forged_two_gib_target_is_refused_without_reserving_it(tmp_path):
    base, new = legit_doc(4), legit_doc(5)
    for binary in (False, True):
        patch = bytearray(ec_patch.diff(base, new, binary=binary))
        # Header (spec §2): magic, version, kind, flags, base_size varint, base SHA-256 (its first 16
        # bytes with flag bit 1, version 2 §2), target_size varint.
        at = 7 + len(_varint(len(base))) + (16 if patch[6] & 0x02 else 32)
        old = _varint(len(new))
        assert bytes(patch[at : at + len(old)]) == old
        forged = bytes(patch[:at]) + _varint((2 << 30) - 1) + bytes(patch[at + len(old) :])
        assert ec_patch.inspect(forged)["target_size"] == (2 << 30) - 1
        result = run_child(tmp_path, "apply", {"base": base, "patch": forged}, bound_for(base, new))
        assert result in {"err codec", "err malformed", "err target_mismatch"}


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_the_callers_limits_apply_to_every_call():
    base, new = legit_doc(6), legit_doc(7)
    lim = ec_patch.Limits(max_file_size=1000)
    assert lim.max_file_size == 1000 and lim.max_part_size == ec_patch.Limits().max_part_size
    assert set(ec_patch.Limits().as_dict()) >= {"max_file_size", "preflate_block_allowance", "preflate_bytes_per_block", "max_preflate_content"}
    patch = ec_patch.diff(base, new)
    for call in (lambda: ec_patch.diff(base, new, limits=lim), lambda: ec_patch.apply(base, patch, limits=lim), lambda: ec_patch.inspect(patch, limits=lim)):
        with pytest.raises(ec_patch.PatchError) as e:
            call()
        assert e.value.code == "limit_exceeded"
    assert ec_patch.apply(base, patch, limits=ec_patch.Limits()) == new
