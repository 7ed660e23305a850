//! §6.7: compare the provider's own hash of the file with every value of
//! it seen in the app's request and the provider's response.
//!
//! These are diagnostics: the SHA-256 check before forwarding is the only
//! gate, and a disagreement changes nothing that is sent or returned; it
//! only sets HASH_DISAGREEMENT. All knowledge of where each provider puts
//! its hash lives here, so the hash crate's API is used in this module
//! only. Values that cannot be read (not JSON, an unknown OC-Checksum
//! algorithm) count as absent. Hashes are computed only when a value to
//! compare with exists, and once per file.

use std::cell::OnceCell;

use ec_provider_hashes::{dropbox_content_hash, md5_hex, quick_xor_hash, OcChecksum};
use serde_json::Value;

use crate::types::{Provider, ProviderRequest, ProviderResponse};

/// One file and its provider hash, computed on first use.
pub(crate) struct FileHash<'a> {
    provider: Provider,
    data: &'a [u8],
    value: OnceCell<String>,
}

impl<'a> FileHash<'a> {
    pub(crate) fn new(provider: Provider, data: &'a [u8]) -> Self {
        Self { provider, data, value: OnceCell::new() }
    }

    fn value(&self) -> &str {
        self.value.get_or_init(|| match self.provider {
            Provider::Dropbox => dropbox_content_hash(self.data),
            Provider::Graph => quick_xor_hash(self.data),
            Provider::Drive => md5_hex(self.data),
            Provider::WebDav => String::new(), // OC-Checksum names its own algorithm
        })
    }

    /// Whether `seen` (a value of this provider's hash) disagrees with the file.
    fn disagrees(&self, seen: &str) -> bool {
        match self.provider {
            // hex: case does not matter
            Provider::Dropbox | Provider::Drive => !seen.eq_ignore_ascii_case(self.value()),
            Provider::Graph => seen != self.value(),
            Provider::WebDav => oc_checksum_disagrees(seen, self.data),
        }
    }
}

/// `OC-Checksum` may list several values separated by spaces; each one we
/// can read is compared.
fn oc_checksum_disagrees(value: &str, data: &[u8]) -> bool {
    value.split_ascii_whitespace().filter_map(|v| OcChecksum::parse(v).ok()).any(|c| !c.matches(data))
}

fn json(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice(bytes).ok()
}

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// The hash values an app request states about its file.
fn request_values(provider: Provider, request: &ProviderRequest) -> Vec<String> {
    match provider {
        Provider::Dropbox => request
            .header("dropbox-api-arg")
            .and_then(json)
            .and_then(|v| str_at(&v, &["content_hash"]).map(str::to_owned))
            .into_iter()
            .collect(),
        Provider::WebDav => request
            .headers
            .iter()
            .filter(|(n, _)| n == "oc-checksum")
            .filter_map(|(_, v)| std::str::from_utf8(v).ok().map(str::to_owned))
            .collect(),
        Provider::Graph | Provider::Drive => vec![],
    }
}

/// The hash value a provider's upload response (2xx) states, from its
/// JSON body: Dropbox FileMetadata, Graph driveItem, Drive file resource.
fn response_value(provider: Provider, body: &Value) -> Option<&str> {
    match provider {
        Provider::Dropbox => str_at(body, &["content_hash"]),
        Provider::Graph => str_at(body, &["file", "hashes", "quickXorHash"]),
        Provider::Drive => str_at(body, &["md5Checksum"]),
        Provider::WebDav => None,
    }
}

/// One-file uploads: the app's request(s) and the final response.
pub(crate) fn upload_disagrees(provider: Provider, app_requests: &[&ProviderRequest], file: &[u8], response: &ProviderResponse) -> bool {
    let hash = FileHash::new(provider, file);
    let mut seen: Vec<String> = app_requests.iter().flat_map(|r| request_values(provider, r)).collect();
    if (200..300).contains(&response.status) {
        if let Some(body) = json(&response.body) {
            seen.extend(response_value(provider, &body).map(str::to_owned));
        }
    }
    seen.iter().any(|v| hash.disagrees(v))
}

/// DROPBOX_BATCH: `entry_files[i]` is the file of the request's entry `i`;
/// compared with each entry's `content_hash` in the request body and in
/// the result entry of the same position.
pub(crate) fn batch_disagrees(request_body: &[u8], entry_files: &[&[u8]], response: &ProviderResponse) -> bool {
    let hashes: Vec<FileHash<'_>> = entry_files.iter().map(|f| FileHash::new(Provider::Dropbox, f)).collect();
    let mut disagree = false;
    let mut check = |entries: Option<&Value>, only_success: bool| {
        let Some(entries) = entries.and_then(Value::as_array) else { return };
        for (entry, hash) in entries.iter().zip(&hashes) {
            if only_success && str_at(entry, &[".tag"]) != Some("success") {
                continue;
            }
            if let Some(v) = str_at(entry, &["content_hash"]) {
                disagree |= hash.disagrees(v);
            }
        }
    };
    let request = json(request_body);
    check(request.as_ref().and_then(|v| v.get("entries")), false);
    if (200..300).contains(&response.status) {
        let body = json(&response.body);
        check(body.as_ref().and_then(|v| v.get("entries")), true);
    }
    disagree
}

/// Downloads: Dropbox `dropbox-api-result` `content_hash`, WebDAV
/// `oc-checksum` response fields. `None` when the provider gave no value.
pub(crate) fn download_disagrees(provider: Provider, response: &ProviderResponse) -> Option<bool> {
    let hash = FileHash::new(provider, &response.body);
    let seen: Vec<String> = match provider {
        Provider::Dropbox => response
            .header("dropbox-api-result")
            .and_then(json)
            .and_then(|v| str_at(&v, &["content_hash"]).map(str::to_owned))
            .into_iter()
            .collect(),
        Provider::WebDav => response
            .headers
            .iter()
            .filter(|(n, _)| n == "oc-checksum")
            .filter_map(|(_, v)| std::str::from_utf8(v).ok().map(str::to_owned))
            .collect(),
        Provider::Graph | Provider::Drive => vec![],
    };
    if seen.is_empty() {
        None
    } else {
        Some(seen.iter().any(|v| hash.disagrees(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Body;

    fn response(status: u16, body: &str) -> ProviderResponse {
        ProviderResponse { status, reason: String::new(), headers: vec![], body: body.to_owned().into() }
    }

    #[test]
    fn graph_quick_xor_in_drive_item() {
        let good = format!(r#"{{"file":{{"hashes":{{"quickXorHash":"{}"}}}}}}"#, quick_xor_hash(b"abc"));
        assert!(!upload_disagrees(Provider::Graph, &[], b"abc", &response(201, &good)));
        assert!(upload_disagrees(Provider::Graph, &[], b"abd", &response(201, &good)));
        // error bodies are not compared
        assert!(!upload_disagrees(Provider::Graph, &[], b"abd", &response(409, &good)));
    }

    #[test]
    fn webdav_request_checksum() {
        let req = ProviderRequest {
            method: http::Method::PUT,
            url: "https://dav.example/x".into(),
            headers: vec![("oc-checksum".into(), b"SHA1:a9993e364706816aba3e25717850c26c9cd0d89d".to_vec())],
            body: Body::Empty,
        };
        assert!(!upload_disagrees(Provider::WebDav, &[&req], b"abc", &response(201, "")));
        assert!(upload_disagrees(Provider::WebDav, &[&req], b"abx", &response(201, "")));
    }

    #[test]
    fn dropbox_hex_case_ignored() {
        let h = dropbox_content_hash(b"x").to_ascii_uppercase();
        let body = format!(r#"{{"content_hash":"{h}"}}"#);
        assert!(!upload_disagrees(Provider::Dropbox, &[], b"x", &response(200, &body)));
    }
}
