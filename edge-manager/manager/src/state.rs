//! The manager's own state, one JSON file written atomically
//! (`<state>/manager.json`: temp, fsync, rename, fsync folder), so that a
//! manager killed at any moment restarts from the last whole state. Secrets
//! are not here: user credentials are kept as SHA-256 hashes; instance keys
//! live in each instance's own `eps.json`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::api::{ExitInfo, InstanceState, RestartPolicy};
use crate::runtime::{Handle, Limits, RuntimeKind};

/// A user.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct User {
    /// SHA-256 (hex) of the credential's secret part.
    pub credential_sha256: String,
    /// Instance limit.
    pub max_instances: u32,
}

/// An instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    /// Its user.
    pub user: String,
    /// Its service.
    pub service: String,
    /// Its backend.
    pub runtime: RuntimeKind,
    /// Its limits.
    pub limits: Limits,
    /// Its restart policy.
    pub restart: RestartPolicy,
    /// Its state as last decided.
    pub state: InstanceState,
    /// The slot: its ports and uid derive from it; `None` while revoked.
    pub slot: Option<u32>,
    /// The uid it runs as (kept across revocation: its state folder is owned by it).
    pub uid: u32,
    /// What the backend persisted to find it again.
    pub handle: Option<Handle>,
    /// Times started.
    pub starts: u64,
    /// Times it ended on its own.
    pub crashes: u64,
    /// Recent automatic restarts (seconds since the epoch), for the policy.
    #[serde(default)]
    pub recent_restarts: Vec<u64>,
    /// How it last ended on its own.
    pub last_exit: Option<ExitInfo>,
    /// Seconds from launch to ready, last start.
    pub ready_seconds: Option<f64>,
}

/// Everything the manager persists.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    /// By name.
    pub users: BTreeMap<String, User>,
    /// By id.
    pub instances: BTreeMap<String, Instance>,
    /// The next uid offset to hand out.
    #[serde(default)]
    pub next_uid: u32,
}

impl State {
    /// Reads the state, or an empty one when there is none yet.
    pub fn load(path: &Path) -> Result<Self, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!("{}: {e} (the file is written atomically; restore it from a backup or remove it to start empty)", path.display())
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Writes it atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// The lowest slot no instance holds.
    pub fn free_slot(&self, max: u32) -> Option<u32> {
        let used: std::collections::BTreeSet<u32> = self.instances.values().filter_map(|i| i.slot).collect();
        (0..max).find(|s| !used.contains(s))
    }
}
