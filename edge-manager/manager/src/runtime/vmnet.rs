//! The network of the VM backends: one routed point-to-point link per
//! instance, and one nftables table per manager that forwards and isolates.
//!
//! # Addressing
//! Instance slot `n` owns the /30 at `subnet + 4n`: the host side of its
//! link is `+1`, the guest `+2`. A link is a tap device (`microvm`) or a Xen
//! vif (`xen`) named `<prefix><n>`; the prefix is derived from the manager's
//! state folder, so that two managers on one host never share a name. No
//! bridge: guests have no layer-2 neighbour.
//!
//! # The table (`ip <table>`, replaced as a whole when the manager starts)
//! - **device ports**: `<device port>` on any address of the access point
//!   → `guest:8443` (prerouting, for the Wi-Fi side: the advertised address
//!   may be one the access point is reached through, not one it holds, as
//!   behind a port forward) and `<advertise>:<device port>` (output, for the
//!   host itself);
//! - **management ports**: `127.0.0.1:<management port>` → `guest:9100`,
//!   from the host itself only (output hook). Loopback-sourced packets leave
//!   through the link with `route_localnet` and are masqueraded to the link's
//!   host address, so the manager's `/healthz` works as for the other
//!   backends;
//! - **isolation**: from a guest link, nothing reaches the host (input
//!   drop), except replies and the `allow_host` services (a lab's provider
//!   servers on the access point itself); nothing is forwarded from one
//!   guest link to another (so neither another user's EPS nor, through a
//!   device port, its DNAT); what a guest sends to the world is masqueraded
//!   to the access point's address.
//!
//! Maps and sets are updated per instance (`nft add element`), so a start
//! costs two small nft calls whatever the number of instances.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::appliance::GuestNet;
use super::RuntimeError;

/// The EPS's device port inside a guest.
pub const GUEST_DEVICE_PORT: u16 = 8443;
/// The EPS's management port inside a guest.
pub const GUEST_MANAGEMENT_PORT: u16 = 9100;

/// Settings of the VM network.
#[derive(Debug, Clone)]
pub struct VmNetConfig {
    /// The first address of the guests' subnet (a /30 per slot).
    pub subnet: Ipv4Addr,
    /// Its prefix length (`/14` holds 65,536 slots; `/24`, 64).
    pub prefix: u8,
    /// Host services guests may reach (host address, TCP port).
    pub allow_host: Vec<SocketAddr>,
}

impl Default for VmNetConfig {
    fn default() -> Self {
        Self { subnet: Ipv4Addr::new(10, 208, 0, 0), prefix: 14, allow_host: vec![] }
    }
}

/// One manager's VM network.
#[derive(Debug)]
pub struct VmNet {
    cfg: VmNetConfig,
    /// Link names are `<prefix><slot>`.
    pub link_prefix: String,
    table: String,
    advertise: IpAddr,
    runtime: &'static str,
}

fn run(runtime: &'static str, cmd: &mut Command) -> Result<String, RuntimeError> {
    let out = cmd.output().map_err(|e| RuntimeError::Failed { runtime, what: format!("{cmd:?}: {e}") })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(RuntimeError::Failed { runtime, what: format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim()) })
    }
}

fn nft(runtime: &'static str, script: &str) -> Result<(), RuntimeError> {
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| RuntimeError::Failed { runtime, what: format!("nft (Debian's nftables) could not run: {e}") })?;
    child.stdin.take().expect("piped").write_all(script.as_bytes()).map_err(|e| RuntimeError::Failed { runtime, what: e.to_string() })?;
    let out = child.wait_with_output().map_err(|e| RuntimeError::Failed { runtime, what: e.to_string() })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RuntimeError::Failed { runtime, what: format!("nft: {}\n{script}", String::from_utf8_lossy(&out.stderr).trim()) })
    }
}

impl VmNet {
    /// Checks the tools and the subnet. Nothing is changed on the host yet.
    pub fn new(cfg: VmNetConfig, state_dir: &std::path::Path, advertise: IpAddr, runtime: &'static str) -> Result<Self, RuntimeError> {
        let unavailable = |missing: String| RuntimeError::Unavailable { runtime, missing };
        if cfg.prefix > 30 || u32::from(cfg.subnet) & !(u32::MAX.checked_shl(32 - u32::from(cfg.prefix)).unwrap_or(0)) != 0 {
            return Err(unavailable(format!(
                "the VM subnet {}/{} is not a network address with a prefix of at most 30",
                cfg.subnet, cfg.prefix
            )));
        }
        if !advertise.is_ipv4() {
            return Err(unavailable("the VM backends forward IPv4 only: advertise an IPv4 address".into()));
        }
        for (tool, arg) in [("nft", "--version"), ("ip", "-V")] {
            if Command::new(tool).arg(arg).output().is_err() {
                return Err(unavailable(format!("`{tool}` is missing (Debian's nftables and iproute2)")));
            }
        }
        let h = Sha256::digest(state_dir.as_os_str().as_encoded_bytes());
        let tag = hex::encode(&h[..2]);
        Ok(Self { cfg, link_prefix: format!("ecv{tag}-"), table: format!("ec_vm_{tag}"), advertise, runtime })
    }

    /// How many slots the subnet holds.
    pub fn capacity(&self) -> u32 {
        1u32 << (30 - u32::from(self.cfg.prefix))
    }

    /// The addresses of slot `n`.
    pub fn guest(&self, slot: u32) -> Result<GuestNet, RuntimeError> {
        if slot >= self.capacity() {
            return Err(RuntimeError::Failed {
                runtime: self.runtime,
                what: format!("slot {slot} is outside the VM subnet {}/{} ({} slots)", self.cfg.subnet, self.cfg.prefix, self.capacity()),
            });
        }
        let base = u32::from(self.cfg.subnet) + 4 * slot;
        Ok(GuestNet { ip: Ipv4Addr::from(base + 2), prefix: 30, gw: Ipv4Addr::from(base + 1) })
    }

    /// The link's name for slot `n`.
    pub fn link(&self, slot: u32) -> String {
        format!("{}{slot}", self.link_prefix)
    }

    /// (Re)creates the table, empty of instances; turns on IPv4 forwarding.
    pub fn setup(&self) -> Result<(), RuntimeError> {
        let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1");
        let p = &self.link_prefix;
        let adv = self.advertise;
        let allow: Vec<String> = self.cfg.allow_host.iter().map(|a| format!("{} . {}", a.ip(), a.port())).collect();
        let allow_elements = if allow.is_empty() { String::new() } else { format!("elements = {{ {} }}", allow.join(", ")) };
        let t = &self.table;
        let script = format!(
            r#"table ip {t}
delete table ip {t}
table ip {t} {{
  map dev {{ type inet_service : ipv4_addr . inet_service; }}
  map mgmt {{ type inet_service : ipv4_addr . inet_service; }}
  set allow_host {{ type ipv4_addr . inet_service; {allow_elements} }}
  chain prerouting {{ type nat hook prerouting priority -100; policy accept;
    fib daddr type local dnat ip addr . port to tcp dport map @dev
  }}
  chain output {{ type nat hook output priority -100; policy accept;
    ip daddr {adv} dnat ip addr . port to tcp dport map @dev
    ip daddr 127.0.0.1 dnat ip addr . port to tcp dport map @mgmt
  }}
  chain postrouting {{ type nat hook postrouting priority 100; policy accept;
    oifname "{p}*" ip saddr 127.0.0.0/8 masquerade
    iifname "{p}*" oifname != "{p}*" masquerade
  }}
  chain input {{ type filter hook input priority 0; policy accept;
    iifname "{p}*" ct state established,related accept
    iifname "{p}*" ip daddr . tcp dport @allow_host accept
    iifname "{p}*" drop
  }}
  chain forward {{ type filter hook forward priority 0; policy accept;
    iifname "{p}*" oifname "{p}*" drop
  }}
}}
"#
        );
        nft(self.runtime, &script)
    }

    /// Removes the table (the manager's shutdown; links are removed per instance).
    pub fn teardown(&self) {
        let _ = nft(self.runtime, &format!("table ip {t}\ndelete table ip {t}\n", t = self.table));
    }

    /// Makes slot `n`'s tap (owned by `uid`, so QEMU opens it unprivileged),
    /// addresses its host side, and points the instance's ports at it.
    pub fn tap_up(&self, slot: u32, uid: u32, gid: u32, device_port: u16, management_port: u16) -> Result<GuestNet, RuntimeError> {
        let g = self.guest(slot)?;
        let link = self.link(slot);
        let _ = Command::new("ip").args(["link", "del", &link]).output();
        run(
            self.runtime,
            Command::new("ip").args(["tuntap", "add", "dev", &link, "mode", "tap", "user", &uid.to_string(), "group", &gid.to_string()]),
        )?;
        self.link_up(slot)?;
        self.forward(slot, device_port, management_port)?;
        Ok(g)
    }

    /// Addresses an existing link (a tap just made, or a Xen vif) and brings it up.
    pub fn link_up(&self, slot: u32) -> Result<(), RuntimeError> {
        let g = self.guest(slot)?;
        let link = self.link(slot);
        run(self.runtime, Command::new("ip").args(["addr", "replace", &format!("{}/30", g.gw), "dev", &link]))?;
        run(self.runtime, Command::new("ip").args(["link", "set", &link, "up"]))?;
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{link}/route_localnet"), "1")
            .map_err(|e| RuntimeError::Failed { runtime: self.runtime, what: format!("route_localnet on {link}: {e}") })?;
        Ok(())
    }

    /// Points the instance's device and management ports at slot `n`'s guest.
    pub fn forward(&self, slot: u32, device_port: u16, management_port: u16) -> Result<(), RuntimeError> {
        let g = self.guest(slot)?;
        let t = &self.table;
        let ip = g.ip;
        // Replace, not add: a stale element of a crashed run would make `add` fail.
        let script = format!("delete element ip {t} dev {{ {device_port} }}\ndelete element ip {t} mgmt {{ {management_port} }}\n");
        let _ = nft(self.runtime, &script);
        nft(
            self.runtime,
            &format!(
                "add element ip {t} dev {{ {device_port} : {ip} . {GUEST_DEVICE_PORT} }}\nadd element ip {t} mgmt {{ {management_port} : {ip} . {GUEST_MANAGEMENT_PORT} }}\n"
            ),
        )
    }

    /// Opens slot `n`'s tap as the manager (root), for QEMU's `-netdev tap,fd=`.
    pub fn open_tap(&self, slot: u32) -> Result<std::os::fd::OwnedFd, RuntimeError> {
        use std::os::fd::FromRawFd;
        #[repr(C)]
        struct IfReq {
            name: [u8; libc::IFNAMSIZ],
            flags: libc::c_short,
            _pad: [u8; 22],
        }
        const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
        const IFF_TAP: libc::c_short = 0x0002;
        const IFF_NO_PI: libc::c_short = 0x1000;
        const IFF_VNET_HDR: libc::c_short = 0x4000;
        let link = self.link(slot);
        let failed = |what: String| RuntimeError::Failed { runtime: self.runtime, what };
        // SAFETY: a plain open; the descriptor is owned right after.
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(failed(format!("/dev/net/tun: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, _pad: [0; 22] };
        req.name[..link.len()].copy_from_slice(link.as_bytes());
        // SAFETY: TUNSETIFF takes a struct ifreq (name, flags), which IfReq lays out.
        if unsafe { libc::ioctl(fd, TUNSETIFF as _, &mut req) } < 0 {
            return Err(failed(format!("attaching to the tap {link}: {}", std::io::Error::last_os_error())));
        }
        Ok(owned)
    }

    /// Undoes [`VmNet::tap_up`] (idempotent).
    pub fn tap_down(&self, slot: u32, device_port: u16, management_port: u16) {
        self.unforward(device_port, management_port);
        let _ = Command::new("ip").args(["link", "del", &self.link(slot)]).output();
    }

    /// Whether any link of this manager exists (a guest still runs).
    pub fn any_link(&self) -> bool {
        Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(": {}", self.link_prefix)))
            .unwrap_or(false)
    }

    /// Removes the instance's port forwards (idempotent).
    pub fn unforward(&self, device_port: u16, management_port: u16) {
        let t = &self.table;
        let _ = nft(self.runtime, &format!("delete element ip {t} dev {{ {device_port} }}"));
        let _ = nft(self.runtime, &format!("delete element ip {t} mgmt {{ {management_port} }}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addressing() {
        let n = VmNet::new(VmNetConfig::default(), std::path::Path::new("/var/lib/edgecourier"), "127.0.0.1".parse().unwrap(), "microvm")
            .unwrap();
        assert_eq!(n.capacity(), 65536);
        let g = n.guest(0).unwrap();
        assert_eq!((g.ip.to_string(), g.gw.to_string(), g.prefix), ("10.208.0.2".into(), "10.208.0.1".into(), 30));
        assert_eq!(n.guest(65).unwrap().ip.to_string(), "10.208.1.6");
        assert!(n.guest(65536).is_err());
        assert!(n.link(3999).len() <= 15, "{}", n.link(3999));
        let small = VmNetConfig { subnet: "10.209.7.0".parse().unwrap(), prefix: 24, allow_host: vec![] };
        let s = VmNet::new(small, std::path::Path::new("/x"), "127.0.0.1".parse().unwrap(), "microvm").unwrap();
        assert_eq!(s.capacity(), 64);
        let bad = VmNetConfig { subnet: "10.209.7.1".parse().unwrap(), prefix: 24, allow_host: vec![] };
        assert!(VmNet::new(bad, std::path::Path::new("/x"), "127.0.0.1".parse().unwrap(), "microvm").is_err());
    }
}
