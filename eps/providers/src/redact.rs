//! What of a URL or a header may be logged (§8): the URL as scheme, host
//! and the first 8 hex digits of the SHA-256 of its path (paths hold file
//! names; query strings and capability URLs hold credentials), and header
//! values only for a short list of harmless fields.

use sha2::{Digest, Sha256};

/// `scheme://host/#<path digest>`, or `<bad url>`.
pub(crate) fn url_for_log(url: &str) -> String {
    match url.parse::<http::Uri>() {
        Ok(uri) => {
            let path = uri.path().as_bytes();
            let digest = hex::encode(&Sha256::digest(path)[..4]);
            format!("{}://{}/#{}", uri.scheme_str().unwrap_or("?"), uri.host().unwrap_or("?"), digest)
        }
        Err(_) => "<bad url>".to_owned(),
    }
}

/// Header fields whose values §8 allows in logs.
const LOGGABLE: &[&str] = &["content-type", "retry-after", "x-dropbox-request-id", "request-id", "client-request-id", "x-request-id"];

/// The value as logged: itself for the allowed fields, `<redacted:N>` otherwise.
pub(crate) fn header_for_log(name: &str, value: &[u8]) -> String {
    if LOGGABLE.contains(&name) {
        String::from_utf8_lossy(value).into_owned()
    } else {
        format!("<redacted:{}>", value.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_path_and_query() {
        let logged = url_for_log("https://graph.microsoft.com/v1.0/me/drive/root:/Secret%20Plan.docx:/content?token=abc");
        assert!(logged.starts_with("https://graph.microsoft.com/#"), "{logged}");
        assert!(!logged.contains("Secret") && !logged.contains("token"));
    }

    #[test]
    fn only_listed_headers_show() {
        assert_eq!(header_for_log("retry-after", b"7"), "7");
        assert_eq!(header_for_log("authorization", b"Bearer x"), "<redacted:8>");
    }
}
