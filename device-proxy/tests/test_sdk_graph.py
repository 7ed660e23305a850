"""The Microsoft Graph SDK for Python (`msgraph-sdk` from PyPI, its httpx
middleware pipeline and Azure-style token provider, unmodified) through
ec-proxy and the real EPS, and through a plain mitmproxy for comparison.

Saves of a LibreOffice document: a simple upload addressed as the SDK
spells a path (`items/root%3A%2FSDK%2FReport.docx%3A/content`), a simple
upload of the same file addressed by the id the first returned (one
document: it travels as a patch), then an upload session created by the
SDK whose fragments are sent in the documented shape (no `Authorization`)
with plain HTTP, because the SDK's own `LargeFileUploadTask` sends its
token on the fragments, which OneDrive answers with 401: that 401 is
checked to be the same with and without EdgeCourier. Downloads through
the SDK (302 to the pre-authenticated URL).
"""

from __future__ import annotations

import asyncio
import hashlib
import io

import httpx
import pytest
from azure.core.credentials import AccessToken
from kiota_abstractions.api_error import APIError
from kiota_authentication_azure.azure_identity_authentication_provider import AzureIdentityAuthenticationProvider
from msgraph import GraphServiceClient
from msgraph.generated.drives.item.items.item.create_upload_session.create_upload_session_post_request_body import (
    CreateUploadSessionPostRequestBody,
)
from msgraph.generated.models.drive_item_uploadable_properties import DriveItemUploadableProperties
from msgraph.graph_request_adapter import GraphRequestAdapter
from msgraph_core import GraphClientFactory
from msgraph_core.tasks.large_file_upload import LargeFileUploadTask

from sdk_lab import LINK_BOUND, ROUTES, SdkLab, documents, sdk_lab

FRAGMENT = 320 * 1024


class StaticToken:
    """A TokenCredential with a token that never expires (the testbed takes
    any bearer token and names the account by it)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get_token(self, *scopes, **kwargs) -> AccessToken:
        return AccessToken(self.token, 4102444800)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from sdk_lab(tmp_path_factory, "sdk-graph")


def graph_client(lab: SdkLab, route: str, token: str) -> GraphServiceClient:
    r = lab.route(route)
    http = GraphClientFactory.create_with_default_middleware(client=httpx.AsyncClient(proxy=r.url, verify=str(r.ca), timeout=120))
    auth = AzureIdentityAuthenticationProvider(StaticToken(token), scopes=["https://graph.microsoft.com/.default"])
    return GraphServiceClient(request_adapter=GraphRequestAdapter(auth, client=http))


def check(lab: SdkLab, token: str, item, data: bytes) -> None:
    assert item.size == len(data)
    held = [f for f in lab.held("graph", token).values() if f["id"] == item.id]
    assert held and held[0]["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("route", ROUTES)
def test_graph_sdk_saves_and_downloads(lab: SdkLab, route: str):
    token = f"sdk-graph-{route}"
    v = documents()

    async def run() -> tuple[list[int], int]:
        client = graph_client(lab, route, token)
        drive = (await client.me.drive.get()).id
        items = client.drives.by_drive_id(drive).items
        sent: list[int] = []

        def total() -> int:  # the device link's bytes, all documents (the saves run one at a time)
            return lab.sent("") if route == "edgecourier" else 0

        # 1. path-addressed simple upload, as the SDK encodes it
        before = total()
        item = await items.by_drive_item_id("root:/SDK/Report.docx:").content.put(v.v0)
        check(lab, token, item, v.v0)
        sent.append(total() - before)
        # 2. the same file addressed by its id: the same document, so a patch
        before = total()
        item = await items.by_drive_item_id(item.id).content.put(v.v1)
        check(lab, token, item, v.v1)
        sent.append(total() - before)
        # 3. an upload session made by the SDK, fragments in the documented shape (no Authorization)
        before = total()
        body = CreateUploadSessionPostRequestBody(item=DriveItemUploadableProperties(
            additional_data={"@microsoft.graph.conflictBehavior": "replace"}))
        session = await items.by_drive_item_id("root:/SDK/Report.docx:").create_upload_session.post(body)
        r = lab.route(route)
        async with httpx.AsyncClient(proxy=r.url, verify=str(r.ca), timeout=120) as plain:
            for start in range(0, len(v.v2), FRAGMENT):
                chunk = v.v2[start : start + FRAGMENT]
                end = start + len(chunk) - 1
                resp = await plain.put(session.upload_url, content=chunk,
                                       headers={"Content-Range": f"bytes {start}-{end}/{len(v.v2)}"})
                assert resp.status_code == (202 if end + 1 < len(v.v2) else 200), resp.text
        final = resp.json()
        assert final["id"] == item.id and final["size"] == len(v.v2)
        sent.append(total() - before)
        # download through the SDK (302 to the pre-authenticated URL): through
        # the EPS (FETCH with FOLLOW_REDIRECT), which answers with a patch
        # against the version the device holds
        fetches = lab.eps.metric("ec_eps_requests_total", 'endpoint="fetch"')
        assert await items.by_drive_item_id("root:/SDK/Report.docx:").content.get() == v.v2
        assert await items.by_drive_item_id(item.id).content.get() == v.v2
        if route == "edgecourier":
            assert lab.eps.metric("ec_eps_requests_total", 'endpoint="fetch"') == fetches + 2
            lines = [ln for ln in lab.proxy.log_path.read_text().splitlines() if "downloaded via the EPS" in ln]
            # addressed as the last save was, the EPS answers with a patch against the device's copy;
            # addressed by id (another key for the same file), it finds that copy by its hash: a patch too
            by_path = int(lines[-2].split("EPS: ")[1].split(" bytes")[0])
            by_id = int(lines[-1].split("EPS: ")[1].split(" bytes")[0])
            assert by_path < LINK_BOUND and by_id < LINK_BOUND, lines[-2:]
        held = [f for f in lab.held("graph", token).values() if f["id"] == item.id]
        assert held[0]["sha256"] == hashlib.sha256(v.v2).hexdigest()
        return sent, len(v.v0)

    sent, size = asyncio.run(run())
    if route == "edgecourier":
        assert sent[0] > size / 2, sent
        # The goal is under 1,000 B; see LINK_BOUND in sdk_lab for what was measured.
        assert all(0 < s < LINK_BOUND for s in sent[1:]), f"device-link bytes per save: {sent}"


def test_graph_sdk_large_file_task_meets_onedrives_401_both_ways(lab: SdkLab):
    """The SDK's LargeFileUploadTask sends Authorization on the fragments;
    OneDrive answers 401 (its documentation warns of it). ec-proxy answers
    the same 401 instead of accepting the fragment (issue 11), and the
    provider gets no file either way."""
    data = b"PK\x03\x04" + bytes(range(256)) * 3000

    async def run(route: str):
        client = graph_client(lab, route, f"sdk-graph-task-{route}")
        drive = (await client.me.drive.get()).id
        body = CreateUploadSessionPostRequestBody(item=DriveItemUploadableProperties(
            additional_data={"@microsoft.graph.conflictBehavior": "replace"}))
        session = await client.drives.by_drive_id(drive).items.by_drive_item_id("root:/SDK/Big.docx:").create_upload_session.post(body)
        task = LargeFileUploadTask(session, client.request_adapter, io.BytesIO(data), max_chunk_size=FRAGMENT)
        with pytest.raises(APIError) as e:
            await task.upload()
        return e.value.response_status_code

    statuses = {route: asyncio.run(run(route)) for route in ROUTES}
    assert statuses == {"edgecourier": 401, "plain": 401}
    for route in ROUTES:
        assert not lab.held("graph", f"sdk-graph-task-{route}"), route
