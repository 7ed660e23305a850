"""Issue 13: what a rebuild needs about its base is learnt once per
version, also for a version the EPS received whole. A module of its own:
its EPS has seen no document before."""

from __future__ import annotations

import hashlib
import time

import ec_protocol as p

from .e2e import TRACES, Uploader


def test_a_file_sent_whole_is_learnt_for_its_next_patch(lab, eps, client):
    """Issue 13: what a rebuild needs about its base is learnt once per
    version. A file the EPS received whole (here the document's first save)
    was not made by a rebuild, so nothing was known of its compressed blocks
    and the next patch's rebuild deflated every block with zlib. Now the EPS
    learns it after answering (`ec_eps_learnt_members_total`), and the next
    patch's rebuild copies the blocks before the edit
    (`ec_eps_rebuild_blocks_copied_total`); the file is exact."""
    up = Uploader("dropbox", "single")
    trace = TRACES / "writer-1m-middle-docx"
    base, new = (trace / "base.docx").read_bytes(), (trace / "new.docx").read_bytes()
    learnt = eps.metric("ec_eps_learnt_members_total")
    assert up.save(client, "learnt.docx", base, None).succeeded
    deadline = time.monotonic() + 60
    while eps.metric("ec_eps_learnt_members_total") == learnt:
        assert time.monotonic() < deadline, "the file saved whole was never learnt"
        time.sleep(0.05)
    assert eps.metric("ec_eps_learnt_members_total") == learnt + 1, "word/document.xml, the one block-parallel member"
    copied = eps.metric("ec_eps_rebuild_blocks_copied_total")
    reparsed = eps.metric("ec_eps_blocks_from_base_parse_total")
    out = up.save(client, "learnt.docx", new, base)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    held = up.held(lab, "learnt.docx")
    assert held and held["sha256"] == hashlib.sha256(new).hexdigest(), held
    assert eps.metric("ec_eps_rebuild_blocks_copied_total") > copied, "the blocks before the edit were copied"
    # The blocks the typed character shifts were made from the base's parse (zport), not by zlib.
    assert eps.metric("ec_eps_blocks_from_base_parse_total") > reparsed, "the shifted blocks were made from the base's parse"
