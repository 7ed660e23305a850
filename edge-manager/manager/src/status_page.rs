//! The operator's status page (`GET /` on the operator listener): one HTML
//! table of the instances, their state, memory, saves and bytes saved, with
//! no script and no external resource, refreshed every 10 s.

use crate::api::InstanceView;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

fn human(b: u64) -> String {
    match b {
        0..=9_999 => format!("{b} B"),
        10_000..=9_999_999 => format!("{:.1} kB", b as f64 / 1000.0),
        _ => mib(b),
    }
}

/// The page.
pub fn render(instances: &[InstanceView], backends: &[String], unavailable: &[(String, String)]) -> String {
    let running = instances.iter().filter(|i| i.state == crate::api::InstanceState::Running).count();
    let memory: u64 = instances.iter().filter_map(|i| i.memory_bytes).sum();
    let saves: u64 = instances.iter().map(|i| i.saves).sum();
    let saved: u64 = instances.iter().map(|i| i.bytes_saved).sum();
    let mut rows = String::new();
    for i in instances {
        let exit = i.last_exit.as_ref().map(|e| esc(&e.reason)).unwrap_or_default();
        rows.push_str(&format!(
            "<tr class=\"{state}\"><td>{id}</td><td>{user}</td><td>{service}</td><td>{rt}</td><td class=\"state\">{state}</td><td class=\"num\">{mem}</td><td class=\"num\">{lim}</td><td class=\"num\">{saves}</td><td class=\"num\">{saved}</td><td class=\"num\">{starts}/{crashes}</td><td>{exit}</td></tr>\n",
            id = esc(&i.id),
            user = esc(&i.user),
            service = esc(&i.service),
            rt = i.runtime.name(),
            state = i.state.name(),
            mem = i.memory_bytes.map(mib).unwrap_or_else(|| "–".into()),
            lim = mib(i.limits.memory_bytes),
            saves = i.saves,
            saved = human(i.bytes_saved),
            starts = i.starts,
            crashes = i.crashes,
        ));
    }
    let missing: String = unavailable.iter().map(|(k, v)| format!("<li><b>{}</b>: {}</li>", esc(k), esc(v))).collect();
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>EdgeCourier edge manager</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }}
h1 {{ font-size: 20px; margin: 0 0 .2em; }}
.summary {{ display: flex; gap: 2em; margin: 1em 0; }}
.summary div {{ background: #f3f5f8; padding: .6em 1em; border-radius: 6px; }}
.summary b {{ display: block; font-size: 20px; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ text-align: left; padding: .35em .6em; border-bottom: 1px solid #e3e6ea; }}
th {{ background: #f3f5f8; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.running td.state {{ color: #176c2a; font-weight: 600; }}
tr.crashed td.state {{ color: #b00020; font-weight: 600; }}
tr.revoked td.state, tr.stopped td.state {{ color: #777; }}
.missing {{ color: #777; }}
</style></head><body>
<h1>EdgeCourier edge manager</h1>
<div class="muted">Backends on this access point: {backends}</div>
<div class="summary">
<div><b id="instances">{n}</b>instances</div><div><b id="running">{running}</b>running</div>
<div><b>{memory}</b>memory of running instances</div><div><b id="saves">{saves}</b>saves</div><div><b>{saved}</b>kept off the Wi-Fi</div>
</div>
<table id="instances-table"><thead><tr><th>instance</th><th>user</th><th>service</th><th>runtime</th><th>state</th><th>memory</th><th>limit</th><th>saves</th><th>bytes saved</th><th>starts/crashes</th><th>last exit</th></tr></thead>
<tbody>
{rows}</tbody></table>
<ul class="missing">{missing}</ul>
</body></html>
"#,
        backends = esc(&backends.join(", ")),
        n = instances.len(),
        memory = mib(memory),
        saved = human(saved),
    )
}
