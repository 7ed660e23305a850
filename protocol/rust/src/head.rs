//! Canonical provider request heads (spec §4.3.1) and response heads
//! (§4.6.1): one byte string per head, `METHOD SP URL LF` or
//! `STATUS SP REASON LF`, then `name: value LF` per field in order.
//!
//! [`Head::parse`] enforces every rule of §4.3.1 and answers with the code
//! the spec names: `limit_exceeded` for a head over `max_head` or with more
//! than `max_headers` field lines, `invalid_request` for everything else.
//! Field values are bytes (Dropbox-API-Arg may carry raw UTF-8), names are
//! ASCII. The same rules are used to check a head before sending it.

use crate::error::{ErrorCode, ProtoError, Result};
use crate::limits::Limits;

/// Request header fields the device must strip and the EPS refuses (§4.3.1).
pub const FORBIDDEN_REQUEST_FIELDS: [&str; 11] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Response header fields the EPS leaves out of a response head (§4.6.1).
pub const FORBIDDEN_RESPONSE_FIELDS: [&str; 8] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length"];

/// What a head may contain beyond the fixed rules: the size limits and
/// whether the lab mode admits `http` URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadRules {
    /// Largest head in bytes (`max_head`, `limit_exceeded`).
    pub max_head: u64,
    /// Most field lines (`max_headers`, `limit_exceeded`).
    pub max_headers: u64,
    /// Longest URL (`max_url`, `invalid_request`).
    pub max_url: u64,
    /// Lab mode: `http` URLs are accepted (the EPS still checks the host
    /// against its configured lab hosts).
    pub allow_http: bool,
}

impl HeadRules {
    /// The rules that follow from `limits`, with `http` refused.
    pub fn from_limits(limits: &Limits) -> Self {
        HeadRules { max_head: limits.max_head, max_headers: limits.max_headers, max_url: limits.max_url, allow_http: false }
    }
}

impl Default for HeadRules {
    fn default() -> Self {
        Self::from_limits(&Limits::default())
    }
}

/// A provider request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// `A`–`Z`, 1 to 16 characters.
    pub method: String,
    /// Absolute `https` (or lab `http`) URL.
    pub url: String,
    /// Lower-case names and raw values, in the app's order.
    pub fields: Vec<(String, Vec<u8>)>,
}

/// A provider response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Three digits.
    pub status: u16,
    /// As received over HTTP/1.1; empty over HTTP/2.
    pub reason: Vec<u8>,
    /// Lower-case names and raw values, in the provider's order.
    pub fields: Vec<(String, Vec<u8>)>,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn check_name(name: &[u8], line: usize) -> Result<String> {
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(ProtoError::invalid(format!("field line {line}: the name is empty or not an RFC 9110 token")));
    }
    if name.iter().any(u8::is_ascii_uppercase) {
        return Err(ProtoError::invalid(format!("field line {line}: the name is not lower case")));
    }
    Ok(String::from_utf8(name.to_vec()).expect("tchars are ASCII"))
}

fn check_value(value: &[u8], line: usize) -> Result<()> {
    if value.iter().any(|&b| b == 0 || b == b'\n' || b == b'\r') {
        return Err(ProtoError::invalid(format!("field line {line}: the value holds NUL, CR or LF")));
    }
    let ws = |b: &u8| *b == b' ' || *b == b'\t';
    if value.first().is_some_and(ws) || value.last().is_some_and(ws) {
        return Err(ProtoError::invalid(format!("field line {line}: the value starts or ends with whitespace")));
    }
    Ok(())
}

/// Splits a head into lines after the size checks common to both kinds.
fn split_lines<'a>(bytes: &'a [u8], rules: &HeadRules, what: &str) -> Result<Vec<&'a [u8]>> {
    if bytes.len() as u64 > rules.max_head {
        return Err(ProtoError::new(
            ErrorCode::LimitExceeded,
            format!("the {what} is {} bytes, over max_head {}", bytes.len(), rules.max_head),
        ));
    }
    let Some(body) = bytes.strip_suffix(b"\n") else {
        return Err(ProtoError::invalid(format!("the {what} is empty or its last line does not end with LF")));
    };
    let lines: Vec<&[u8]> = body.split(|&b| b == b'\n').collect();
    if lines.len() as u64 - 1 > rules.max_headers {
        return Err(ProtoError::new(
            ErrorCode::LimitExceeded,
            format!("the {what} has {} field lines, over max_headers {}", lines.len() - 1, rules.max_headers),
        ));
    }
    Ok(lines)
}

fn parse_fields(lines: &[&[u8]], forbidden: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut fields = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(ProtoError::invalid(format!("field line {n} has no colon (an empty line is not allowed)")));
        };
        let name = check_name(&line[..colon], n)?;
        let Some(value) = line[colon + 1..].strip_prefix(b" ") else {
            return Err(ProtoError::invalid(format!("field line {n}: the colon is not followed by one space")));
        };
        check_value(value, n)?;
        if name.starts_with(':') || forbidden.contains(&name.as_str()) {
            return Err(ProtoError::invalid(format!("field line {n}: a forbidden field name")));
        }
        fields.push((name, value.to_vec()));
    }
    Ok(fields)
}

fn write_fields(out: &mut Vec<u8>, fields: &[(String, Vec<u8>)]) {
    for (name, value) in fields {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.push(b'\n');
    }
}

impl Head {
    /// Parses and checks a canonical request head.
    pub fn parse(bytes: &[u8], rules: &HeadRules) -> Result<Head> {
        let lines = split_lines(bytes, rules, "head")?;
        let first = lines[0];
        let Some(sp) = first.iter().position(|&b| b == b' ') else {
            return Err(ProtoError::invalid("the request line has no space between method and URL"));
        };
        let (method, url) = (&first[..sp], &first[sp + 1..]);
        if method.is_empty() || method.len() > 16 || !method.iter().all(u8::is_ascii_uppercase) {
            return Err(ProtoError::invalid("the method is not 1 to 16 letters A-Z"));
        }
        check_url(url, rules)?;
        let fields = parse_fields(&lines[1..], &FORBIDDEN_REQUEST_FIELDS)?;
        Ok(Head {
            method: String::from_utf8(method.to_vec()).expect("checked ASCII"),
            url: String::from_utf8(url.to_vec()).expect("checked ASCII"),
            fields,
        })
    }

    /// The canonical bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.url.len());
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.url.as_bytes());
        out.push(b'\n');
        write_fields(&mut out, &self.fields);
        out
    }

    /// The first value of field `name` (lower case).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }

    /// The host of the URL, lower-cased, without port or brackets.
    pub fn host(&self) -> String {
        url_host(&self.url).expect("a parsed head has a checked URL")
    }
}

impl ResponseHead {
    /// Parses and checks a canonical response head. A violation is
    /// `malformed`: the device is reading what the EPS built (§4.6.1).
    pub fn parse(bytes: &[u8], max_head: u64, max_headers: u64) -> Result<ResponseHead> {
        let rules = HeadRules { max_head, max_headers, max_url: 0, allow_http: false };
        let as_malformed = |e: ProtoError| {
            if e.code == ErrorCode::InvalidRequest {
                ProtoError::malformed(format!("response head: {}", e.detail))
            } else {
                e
            }
        };
        let lines = split_lines(bytes, &rules, "response head").map_err(as_malformed)?;
        let first = lines[0];
        if first.len() < 4 || !first[..3].iter().all(u8::is_ascii_digit) || first[3] != b' ' {
            return Err(ProtoError::malformed("response head: the status line is not three digits and a space"));
        }
        let reason = &first[4..];
        if reason.iter().any(|&b| b == 0 || b == b'\r' || (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(ProtoError::malformed("response head: the reason holds a control character"));
        }
        let fields = parse_fields(&lines[1..], &FORBIDDEN_RESPONSE_FIELDS).map_err(as_malformed)?;
        let status = first[..3].iter().fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
        Ok(ResponseHead { status, reason: reason.to_vec(), fields })
    }

    /// The canonical bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{:03} ", self.status).into_bytes();
        out.extend_from_slice(&self.reason);
        out.push(b'\n');
        write_fields(&mut out, &self.fields);
        out
    }

    /// The first value of field `name` (lower case).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// Checks a URL against §4.3.1: at most `max_url` bytes of 0x21–0x7E,
/// `https://` (or `http://` when the rules allow it) in lower case, a
/// non-empty host, no userinfo, no fragment. Violations are
/// `invalid_request`.
pub fn check_url(url: &[u8], rules: &HeadRules) -> Result<()> {
    if url.len() as u64 > rules.max_url {
        return Err(ProtoError::invalid(format!("the URL is {} bytes, over max_url {}", url.len(), rules.max_url)));
    }
    if !url.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return Err(ProtoError::invalid("the URL holds a byte outside 0x21-0x7E"));
    }
    let rest = if let Some(r) = url.strip_prefix(b"https://") {
        r
    } else if let Some(r) = url.strip_prefix(b"http://").filter(|_| rules.allow_http) {
        r
    } else {
        return Err(ProtoError::invalid("the URL is not an absolute https URL"));
    };
    if url.contains(&b'#') {
        return Err(ProtoError::invalid("the URL has a fragment"));
    }
    let authority = &rest[..rest.iter().position(|&b| b == b'/' || b == b'?').unwrap_or(rest.len())];
    if authority.contains(&b'@') {
        return Err(ProtoError::invalid("the URL has userinfo"));
    }
    let host = host_of_authority(authority);
    if host.is_empty() {
        return Err(ProtoError::invalid("the URL has no host"));
    }
    Ok(())
}

fn host_of_authority(authority: &[u8]) -> &[u8] {
    if let Some(v6) = authority.strip_prefix(b"[") {
        return &v6[..v6.iter().position(|&b| b == b']').unwrap_or(v6.len())];
    }
    &authority[..authority.iter().position(|&b| b == b':').unwrap_or(authority.len())]
}

/// The host of an `http(s)` URL, lower-cased, without port or IPv6
/// brackets, if the URL has that shape. Use [`check_url`] first for the
/// full rules.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let authority = &rest.as_bytes()[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.contains(&b'@') {
        return None;
    }
    let host = host_of_authority(authority);
    (!host.is_empty()).then(|| String::from_utf8_lossy(host).to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &[u8] = b"POST https://content.dropboxapi.com/2/files/upload\nauthorization: Bearer x\ndropbox-api-arg: {\"path\":\"/caf\xc3\xa9.docx\"}\ncontent-type: application/octet-stream\n";

    fn code(bytes: &[u8]) -> ErrorCode {
        Head::parse(bytes, &HeadRules::default()).unwrap_err().code
    }

    #[test]
    fn a_canonical_head_round_trips() {
        let h = Head::parse(HEAD, &HeadRules::default()).unwrap();
        assert_eq!(h.method, "POST");
        assert_eq!(h.host(), "content.dropboxapi.com");
        assert_eq!(h.fields.len(), 3);
        assert_eq!(h.field("authorization"), Some(&b"Bearer x"[..]));
        assert_eq!(h.to_bytes(), HEAD);
        let bare = Head::parse(b"GET https://h/\nx-empty: \n", &HeadRules::default()).unwrap();
        assert_eq!(bare.field("x-empty"), Some(&b""[..]));
    }

    #[test]
    fn every_rule_maps_to_its_code() {
        use ErrorCode::*;
        let cases: &[(&[u8], ErrorCode)] = &[
            (b"", InvalidRequest),
            (b"GET https://h/", InvalidRequest),
            (b"get https://h/\n", InvalidRequest),
            (b"GETGETGETGETGETGE https://h/\n", InvalidRequest),
            (b"GET http://h/\n", InvalidRequest),
            (b"GET https://u:p@h/\n", InvalidRequest),
            (b"GET https://h/#f\n", InvalidRequest),
            (b"GET https://h/ x\n", InvalidRequest),
            (b"GET https:///x\n", InvalidRequest),
            (b"GET ftp://h/\n", InvalidRequest),
            (b"GET https://h/\nHost: h\n", InvalidRequest),
            (b"GET https://h/\nhost: h\n", InvalidRequest),
            (b"GET https://h/\ncontent-length: 1\n", InvalidRequest),
            (b"GET https://h/\nexpect: 100-continue\n", InvalidRequest),
            (b"GET https://h/\nx: a\rb\n", InvalidRequest),
            (b"GET https://h/\nx: a\0b\n", InvalidRequest),
            (b"GET https://h/\nx:  a\n", InvalidRequest),
            (b"GET https://h/\nx: a \n", InvalidRequest),
            (b"GET https://h/\nx:a\n", InvalidRequest),
            (b"GET https://h/\n\n", InvalidRequest),
            (b"GET https://h/\nx y: a\n", InvalidRequest),
        ];
        for (bytes, want) in cases {
            assert_eq!(code(bytes), *want, "{}", String::from_utf8_lossy(bytes));
        }
        let lab = HeadRules { allow_http: true, ..HeadRules::default() };
        assert!(Head::parse(b"GET http://127.0.0.1:8080/x\n", &lab).is_ok());
        let many: Vec<u8> = [&b"GET https://h/\n"[..], &b"x: 1\n".repeat(101)].concat();
        assert_eq!(code(&many), LimitExceeded);
        let big: Vec<u8> = [&b"GET https://h/\nx: "[..], &vec![b'a'; 65_536], b"\n"].concat();
        assert_eq!(code(&big), LimitExceeded);
        let long_url: Vec<u8> = [&b"GET https://h/"[..], &vec![b'a'; 8192], b"\n"].concat();
        assert_eq!(code(&long_url), InvalidRequest);
    }

    #[test]
    fn hosts() {
        assert_eq!(url_host("https://Graph.Microsoft.com/v1.0/me").as_deref(), Some("graph.microsoft.com"));
        assert_eq!(url_host("https://h:8443?x").as_deref(), Some("h"));
        assert_eq!(url_host("http://[::1]:80/").as_deref(), Some("::1"));
        assert_eq!(url_host("https://a@h/"), None);
        assert_eq!(url_host("ftp://h/"), None);
    }

    #[test]
    fn response_heads() {
        let bytes = b"200 OK\ncontent-type: application/json\nx-dropbox-request-id: abc\n";
        let h = ResponseHead::parse(bytes, 65_536, 100).unwrap();
        assert_eq!((h.status, h.reason.as_slice()), (200, &b"OK"[..]));
        assert_eq!(h.to_bytes(), bytes);
        assert_eq!(ResponseHead::parse(b"200 \n", 65_536, 100).unwrap().reason, b"");
        for bad in [&b"20 OK\n"[..], b"200OK\n", b"200 OK\ncontent-length: 5\n", b"200 OK\nX: y\n", b"200 OK"] {
            assert_eq!(ResponseHead::parse(bad, 65_536, 100).unwrap_err().code, ErrorCode::Malformed);
        }
    }
}
