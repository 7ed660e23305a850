//! The manager's Prometheus metrics (`GET /metrics` on the operator
//! listener): instances by runtime and state, starts, crashes,
//! start-to-ready time, and per instance its memory and the EPS's own save
//! counters, gathered from each EPS's `/metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::api::InstanceView;
use crate::runtime::RuntimeKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuntimeLabel {
    runtime: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    runtime: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabel {
    instance: String,
    runtime: &'static str,
}

/// The manager's metrics.
#[derive(Debug)]
pub struct Metrics {
    starts: Family<RuntimeLabel, Counter>,
    crashes: Family<RuntimeLabel, Counter>,
    ready: Family<RuntimeLabel, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty counters.
    pub fn new() -> Self {
        Self {
            starts: Family::default(),
            crashes: Family::default(),
            ready: Family::new_with_constructor(|| Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0].into_iter())),
        }
    }

    /// An instance was launched.
    pub fn started(&self, rt: RuntimeKind) {
        self.starts.get_or_create(&RuntimeLabel { runtime: rt.name() }).inc();
    }

    /// An instance ended on its own.
    pub fn crashed(&self, rt: RuntimeKind) {
        self.crashes.get_or_create(&RuntimeLabel { runtime: rt.name() }).inc();
    }

    /// An instance answered `/healthz` this long after its launch.
    pub fn ready(&self, rt: RuntimeKind, seconds: f64) {
        self.ready.get_or_create(&RuntimeLabel { runtime: rt.name() }).observe(seconds);
    }

    /// The text exposition, with the instance gauges made from `instances`.
    pub fn render(&self, instances: &[InstanceView]) -> String {
        let mut r = Registry::with_prefix("ec_edge");
        let by_state: Family<StateLabel, Gauge> = Family::default();
        let memory: Family<InstanceLabel, Gauge> = Family::default();
        let saves: Family<InstanceLabel, Gauge> = Family::default();
        let saved: Family<InstanceLabel, Gauge> = Family::default();
        for rt in RuntimeKind::ALL {
            for st in crate::api::InstanceState::ALL {
                let _ = by_state.get_or_create(&StateLabel { runtime: rt.name(), state: st.name() });
            }
        }
        for i in instances {
            by_state.get_or_create(&StateLabel { runtime: i.runtime.name(), state: i.state.name() }).inc();
            let l = InstanceLabel { instance: i.id.clone(), runtime: i.runtime.name() };
            if let Some(m) = i.memory_bytes {
                memory.get_or_create(&l).set(m as i64);
            }
            saves.get_or_create(&l).set(i.saves as i64);
            saved.get_or_create(&l).set(i.bytes_saved as i64);
        }
        r.register("instances", "Instances by runtime and state", by_state);
        r.register("starts", "Instance launches", self.starts.clone());
        r.register("crashes", "Instances that ended on their own", self.crashes.clone());
        r.register("start_to_ready_seconds", "From launch to the first healthy /healthz", self.ready.clone());
        r.register("instance_memory_bytes", "Host memory charged to each running instance (its cgroup)", memory);
        r.register("instance_saves", "Saves each EPS answered (gathered from its /metrics)", saves);
        r.register("instance_bytes_saved", "Bytes each EPS kept off the device link (gathered)", saved);
        let mut out = String::new();
        let _ = encode(&mut out, &r);
        out
    }
}
