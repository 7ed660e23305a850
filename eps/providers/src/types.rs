//! The values the service hands in (requests, procedures) and gets back
//! (responses and what was performed). They mirror the SAVE and FETCH
//! messages of §4.5 and §4.8 after decoding: heads already in canonical
//! form, bodies already assembled from the rebuilt file.

use bytes::Bytes;

/// One provider request as the app made it (or as a procedure makes it).
///
/// Header names are lower case (§4.3.1) and never one of the fields the
/// transport derives (`host`, `content-length`, hop-by-hop fields); values
/// are raw bytes, sent exactly as given.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderRequest {
    /// The method, e.g. `PUT`.
    pub method: http::Method,
    /// The absolute URL.
    pub url: String,
    /// Header fields in the app's order; repeated names are separate entries.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Body,
}

impl std::fmt::Debug for ProviderRequest {
    // Header values and URLs may be credentials (§8): only names and sizes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderRequest")
            .field("method", &self.method)
            .field("url", &crate::redact::url_for_log(&self.url))
            .field("headers", &self.headers.iter().map(|(n, v)| (n.as_str(), v.len())).collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl ProviderRequest {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// A request body, as §4.3.3's body kinds assemble it.
#[derive(Clone, PartialEq, Eq)]
pub enum Body {
    /// No body.
    Empty,
    /// Bytes that are not the file (a JSON body).
    Bytes(Bytes),
    /// The file itself.
    File(Bytes),
    /// A multipart body with the file inside: `prefix ‖ file ‖ suffix`.
    Wrapped {
        /// Bytes before the file.
        prefix: Bytes,
        /// The file.
        file: Bytes,
        /// Bytes after the file.
        suffix: Bytes,
    },
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("Empty"),
            Self::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Self::File(b) => write!(f, "File({} bytes)", b.len()),
            Self::Wrapped { prefix, file, suffix } => {
                write!(f, "Wrapped({} + {} + {} bytes)", prefix.len(), file.len(), suffix.len())
            }
        }
    }
}

impl Body {
    /// Total length in bytes.
    pub fn len(&self) -> u64 {
        self.parts().iter().map(|p| p.len() as u64).sum()
    }
    /// Whether the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The file this body carries, if any.
    pub fn file(&self) -> Option<&Bytes> {
        match self {
            Self::File(f) | Self::Wrapped { file: f, .. } => Some(f),
            _ => None,
        }
    }
    /// The pieces in sending order (no copy of the file is made).
    pub(crate) fn parts(&self) -> Vec<Bytes> {
        match self {
            Self::Empty => vec![],
            Self::Bytes(b) | Self::File(b) => vec![b.clone()],
            Self::Wrapped { prefix, file, suffix } => vec![prefix.clone(), file.clone(), suffix.clone()],
        }
    }
}

/// A file sent while it is being produced (spec §5.6, streamed saves): the
/// body of one SINGLE request whose file comes from a rebuild still running.
///
/// The producer sends the file's bytes in order as [`Feed::Data`], never
/// all of them: the request's body cannot end until [`Feed::Done`] brings
/// the held-back tail together with the whole file, which the producer
/// sends only once the file's size and SHA-256 are verified. A producer
/// that drops its sender without `Done` aborts the request: the transport
/// fails the body, and the connection is closed with the declared
/// `Content-Length` not reached, so no provider commits the upload.
#[derive(Debug)]
pub struct FileFeed {
    /// The file's size (the item's target size); `Content-Length` counts it. Never 0.
    pub len: u64,
    /// The producer's messages.
    pub rx: tokio::sync::mpsc::Receiver<Feed>,
}

/// One message of a [`FileFeed`].
#[derive(Debug)]
pub enum Feed {
    /// The next bytes of the file (at least one byte of the file always stays for `Done`).
    Data(Bytes),
    /// The file is verified: its last bytes (`tail`) and the whole file.
    Done {
        /// The bytes of the file not sent as `Data`.
        tail: Bytes,
        /// The whole file, for the provider-hash comparison of §6.7.
        file: Bytes,
    },
}

/// A provider response as received, in the form §4.6.1 carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderResponse {
    /// The status code.
    pub status: u16,
    /// The reason phrase as received over HTTP/1.x; empty over HTTP/2.
    pub reason: String,
    /// Header fields, lower-case names, in the provider's order, without
    /// hop-by-hop fields and `content-length` (§4.6.1).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body (as received: never decompressed).
    pub body: Bytes,
}

impl std::fmt::Debug for ProviderResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderResponse")
            .field("status", &self.status)
            .field("headers", &self.headers.iter().map(|(n, v)| (n.as_str(), v.len())).collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl ProviderResponse {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// The providers, as the document keys number them (§4.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// Dropbox API v2.
    Dropbox,
    /// Microsoft Graph / OneDrive.
    Graph,
    /// Google Drive v3.
    Drive,
    /// WebDAV, Nextcloud included.
    WebDav,
}

impl Provider {
    /// A short lower-case name for logs and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Dropbox => "dropbox",
            Self::Graph => "graph",
            Self::Drive => "drive",
            Self::WebDav => "webdav",
        }
    }
}

/// What the EPS performs for one save (§6). Each variant names the app's
/// request(s) the procedure starts from and the rebuilt file(s).
#[derive(Debug, Clone)]
pub enum Procedure {
    /// §6.1: one request whose body is `File` or `Wrapped`.
    Single {
        /// The app's request, body assembled.
        request: ProviderRequest,
    },
    /// §6.2: Dropbox `upload_session/start`, `append_v2`…, then the app's `finish`.
    DropboxSession {
        /// The app's `finish` request (body `Empty`).
        finish: ProviderRequest,
        /// The file.
        file: Bytes,
        /// The session id the device issued (must equal `cursor.session_id`).
        binding: String,
    },
    /// §6.3: one session per item, then the app's `finish_batch_v2`.
    DropboxBatch {
        /// The app's `finish_batch_v2` request (body `Bytes`: the JSON).
        batch: ProviderRequest,
        /// Per item: the device-issued session id and the file.
        items: Vec<(String, Bytes)>,
    },
    /// §6.4: `createUploadSession`, then fragments to the `uploadUrl`.
    GraphSession {
        /// The app's `createUploadSession` request.
        create: ProviderRequest,
        /// The file.
        file: Bytes,
    },
    /// §6.5: resumable initiation, then chunks to the session URI.
    DriveResumable {
        /// The app's initiation request (`uploadType=resumable`).
        initiate: ProviderRequest,
        /// The file.
        file: Bytes,
    },
    /// §6.6: `MKCOL`, numbered chunk `PUT`s, `MOVE …/.file`.
    NextcloudChunked {
        /// The app's `MKCOL` request.
        mkcol: ProviderRequest,
        /// The app's `MOVE` request.
        mv: ProviderRequest,
        /// The file.
        file: Bytes,
    },
}

impl Procedure {
    /// The protocol's procedure name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Single { .. } => "single",
            Self::DropboxSession { .. } => "dropbox_session",
            Self::DropboxBatch { .. } => "dropbox_batch",
            Self::GraphSession { .. } => "graph_session",
            Self::DriveResumable { .. } => "drive_resumable",
            Self::NextcloudChunked { .. } => "nextcloud_chunked",
        }
    }

    /// The app requests the procedure names (the ones the device sent).
    pub fn app_requests(&self) -> Vec<&ProviderRequest> {
        match self {
            Self::Single { request } => vec![request],
            Self::DropboxSession { finish, .. } => vec![finish],
            Self::DropboxBatch { batch, .. } => vec![batch],
            Self::GraphSession { create, .. } => vec![create],
            Self::DriveResumable { initiate, .. } => vec![initiate],
            Self::NextcloudChunked { mkcol, mv, .. } => vec![mkcol, mv],
        }
    }
}

/// The outcome of a procedure that produced a provider response.
#[derive(Debug, Clone)]
pub struct Performed {
    /// The response to hand to the app (final request's, or the first >= 400).
    pub response: ProviderResponse,
    /// Provider requests sent, cleanup requests included.
    pub calls: u32,
    /// Each of those requests' status (`None`: no response), in completion
    /// order: per-call metrics count every call with its own status.
    pub call_statuses: Vec<Option<u16>>,
    /// Bytes sent to providers (bodies plus canonical heads).
    pub bytes_sent: u64,
    /// Bytes received from providers (bodies plus canonical heads).
    pub bytes_received: u64,
    /// Per item (in the procedure's item order): whether the provider
    /// accepted it. For DROPBOX_BATCH per entry (§6.3); otherwise every
    /// item follows the final status being 2xx.
    pub succeeded_items: Vec<bool>,
    /// A provider hash disagreed with the file (§6.7).
    pub hash_disagreement: bool,
}

/// The outcome of a download (§6.8).
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The redirect that was followed (part 0 of FETCH_RESULT), if any.
    pub redirect: Option<ProviderResponse>,
    /// The final response.
    pub response: ProviderResponse,
    /// Each provider request's status (the redirect's, then the final one's).
    pub call_statuses: Vec<Option<u16>>,
    /// A provider hash of the body disagreed with it.
    pub hash_disagreement: bool,
    /// The final status is 200, the body is complete, not content-encoded,
    /// and no provider hash disagreed: the body is the file and may be
    /// stored and sent as a patch.
    pub body_checked: bool,
}
