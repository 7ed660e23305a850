"""The provider routes added so rclone's dropbox and onedrive backends work,
checked against the providers' documentation directly (not through rclone):

- Graph folders (driveitem-post-children, list-children with `$top` and
  `@odata.nextLink`, get by id, parent-relative `items/{id}:/name:`, delete),
  `PATCH` of `fileSystemInfo` (driveitem-update), the `fileSystemInfo` of an
  upload session's item, `parentReference.id` and `hashes.sha1Hash`;
- Dropbox files/list_folder `limit` and files/list_folder/continue.
"""

from __future__ import annotations

import hashlib
import json

D = "https://graph.microsoft.com/v1.0/me/drive"
API = "https://api.dropboxapi.com/2/files/"
CONTENT = "https://content.dropboxapi.com/2/files/"


def mkdir(client, parent: str, name: str, **extra):
    return client.request("POST", f"{D}/{parent}/children", json_body={"name": name, "folder": {}, **extra})


def test_graph_folder_create_get_and_conflicts(client):
    root = client.request("GET", D + "/root").json()
    assert "root" in root and root["folder"]["childCount"] == 0
    r = mkdir(client, f"items/{root['id']}", "Reports")
    assert r.status == 201
    folder = r.json()
    assert folder["name"] == "Reports" and "folder" in folder and folder["parentReference"]["id"] == root["id"]
    # the id addresses it, so does its path, and both give the same item
    assert client.request("GET", f"{D}/items/{folder['id']}").json()["id"] == folder["id"]
    assert client.request("GET", f"{D}/root:/reports:").json()["id"] == folder["id"]
    # default conflictBehavior for a new folder is fail; rename picks a free name
    again = mkdir(client, "root", "Reports")
    assert again.status == 409 and again.json()["error"]["code"] == "nameAlreadyExists"
    renamed = mkdir(client, "root", "Reports", **{"@microsoft.graph.conflictBehavior": "rename"})
    assert renamed.status == 201 and renamed.json()["name"] == "Reports 1"
    missing = client.request("POST", f"{D}/items/NOPE!1/children", json_body={"name": "x", "folder": {}})
    assert missing.status == 404 and missing.json()["error"]["code"] == "itemNotFound"
    no_facet = client.request("POST", f"{D}/root/children", json_body={"name": "x"})
    assert no_facet.status == 400


def test_graph_upload_into_folder_by_id_and_list_children_in_pages(client):
    folder = mkdir(client, "root", "Docs").json()
    names = [f"f{i}.docx" for i in range(5)]
    for n in names:
        r = client.request("PUT", f"{D}/items/{folder['id']}:/{n}:/content", data=n.encode())
        assert r.status == 201
        item = r.json()
        assert item["parentReference"]["id"] == folder["id"] and item["parentReference"]["path"] == "/drive/root:/Docs"
        assert item["file"]["hashes"]["sha1Hash"] == hashlib.sha1(n.encode()).hexdigest().upper()
    mkdir(client, f"items/{folder['id']}", "Sub")
    seen, url, pages = [], f"{D}/items/{folder['id']}/children?$top=2", 0
    while url:
        page = client.request("GET", url).json()
        assert len(page["value"]) <= 2
        seen += [i["name"] for i in page["value"]]
        url = page.get("@odata.nextLink")
        pages += 1
    assert sorted(seen) == sorted(names + ["Sub"]) and len(seen) == 6 and pages == 3
    assert client.request("GET", f"{D}/items/{folder['id']}").json()["folder"]["childCount"] == 6
    # a file has no children, and an upload cannot target a folder
    file_id = client.request("GET", f"{D}/root:/Docs/f0.docx:").json()["id"]
    assert client.request("GET", f"{D}/items/{file_id}/children").status == 400
    assert client.request("PUT", f"{D}/items/{folder['id']}/content", data=b"x").status == 400


def test_graph_patch_file_system_info_and_session_item_times(client):
    created = client.request("PUT", f"{D}/root:/a.docx:/content", data=b"one").json()
    when = "2021-03-04T05:06:07Z"
    r = client.request("PATCH", f"{D}/items/{created['id']}", json_body={"fileSystemInfo": {"lastModifiedDateTime": when}})
    assert r.status == 200 and r.json()["fileSystemInfo"]["lastModifiedDateTime"] == when
    assert client.request("GET", f"{D}/root:/a.docx:").json()["fileSystemInfo"]["lastModifiedDateTime"] == when
    # content is untouched by a metadata update
    assert r.json()["eTag"] == created["eTag"]
    bad = client.request("PATCH", f"{D}/items/{created['id']}", json_body={"fileSystemInfo": {"lastModifiedDateTime": "yesterday"}})
    assert bad.status == 400
    unsupported = client.request("PATCH", f"{D}/items/{created['id']}", json_body={"name": "b.docx"})
    assert unsupported.status == 400
    # an upload session's item carries the client's timestamps into the new version
    s = client.request("POST", f"{D}/root:/b.docx:/createUploadSession",
                       json_body={"item": {"fileSystemInfo": {"lastModifiedDateTime": when}}}).json()
    done = client.request("PUT", s["uploadUrl"], data=b"two", token=None, headers={"Content-Range": "bytes 0-2/3"})
    assert done.status == 201 and done.json()["fileSystemInfo"]["lastModifiedDateTime"] == when


def test_graph_fragment_with_authorization_is_refused_by_default(client):
    s = client.request("POST", f"{D}/root:/c.docx:/createUploadSession").json()
    r = client.request("PUT", s["uploadUrl"], data=b"abc", headers={"Content-Range": "bytes 0-2/3"})
    assert r.status == 401


def test_graph_delete_folder_deletes_its_files(client):
    mkdir(client, "root", "Old")
    client.request("PUT", f"{D}/root:/Old/x.docx:/content", data=b"x")
    client.request("PUT", f"{D}/root:/Keep/y.docx:/content", data=b"y")
    assert client.request("DELETE", f"{D}/root:/Old:").status == 204
    assert [f["path"] for f in client.files("graph")] == ["/Keep/y.docx"]
    assert client.request("GET", f"{D}/root:/Old:").status == 404


def _list(client, route, arg):
    return client.request("POST", API + route, json_body=arg)


def test_dropbox_list_folder_pages_with_limit_and_continue(client):
    for i in range(5):
        r = client.request("POST", CONTENT + "upload", data=b"%d" % i, headers={
            "Dropbox-API-Arg": json.dumps({"path": f"/Docs/f{i}.docx", "mode": "add"}),
            "Content-Type": "application/octet-stream"})
        assert r.status == 200
    first = _list(client, "list_folder", {"path": "/Docs", "limit": 2}).json()
    names, page = [e["name"] for e in first["entries"]], first
    while page["has_more"]:
        page = _list(client, "list_folder/continue", {"cursor": page["cursor"]}).json()
        names += [e["name"] for e in page["entries"]]
    assert names == [f"f{i}.docx" for i in range(5)]
    stale = _list(client, "list_folder/continue", {"cursor": "tb-cursor-unknown"})
    assert stale.status == 409 and stale.json()["error"][".tag"] == "reset"
    assert _list(client, "list_folder", {"path": "/Docs", "limit": 0}).status == 400
    assert _list(client, "list_folder", {"path": "/Nope"}).status == 409
