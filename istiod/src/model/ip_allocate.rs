//! IP auto-allocation for ServiceEntries without `addresses`, as Istio's
//! controller gives them (`pilot/pkg/controllers/ipallocate`,
//! `pilot/pkg/networking/serviceentry/ip_autoallocation.go`): each host of
//! an entry that qualifies gets one address from `240.240.0.0/16` and one
//! from `2001:2::/48`, recorded in the entry's `status.addresses`.
//!
//! Istio's controller hands out the next free address in the order entries
//! arrive and relies on the status to keep them. A directory of files has
//! no status, so here an address is derived from the entry itself: the
//! FNV-1a hash of `namespace/name/host` picks a slot of the /16, probing
//! forward past used slots, and slot `n` is both `240.240.0.0 + n` and
//! `2001:2:: + n`. The same objects give the same addresses after every
//! restart. Addresses already in `status.addresses` (written on Kubernetes,
//! see `source/kube/ip_allocate`) are kept; when two entries claim one, the
//! older entry keeps it (Istio's conflict rule) and the other is moved.
//! Only a new entry whose slot collides with an older one's can move an
//! address of the file source, and only when it sorts first.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::istio::{Resolution, ServiceEntry};
use super::meta::{ObjectKey, ObjectMeta};
use super::store::{Snapshot, Typed};

/// Istio's `PILOT_IP_AUTOALLOCATE_IPV4_PREFIX` default, `240.240.0.0/16`.
pub const IPV4_PREFIX: (Ipv4Addr, u8) = (Ipv4Addr::new(240, 240, 0, 0), 16);
/// Istio's `PILOT_IP_AUTOALLOCATE_IPV6_PREFIX` default, `2001:2::/48`.
pub const IPV6_PREFIX: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0), 48);
/// The label that opts an entry out (`"false"`), Istio's
/// `networking.istio.io/enable-autoallocate-ip`.
pub const ENABLE_AUTOALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";

/// Slots `1..=SLOTS` of the /16 (the network address itself is skipped, as
/// Istio's allocator starts at the prefix's next address).
const SLOTS: u32 = (1 << (32 - IPV4_PREFIX.1)) - 1;

/// Whether an entry gets addresses (Istio's `ShouldV2AutoAllocateIP`): not
/// for resolution NONE (the data plane could not honour them), not when
/// the label opts out, not when the user gave `addresses`.
pub fn should_allocate(meta: &ObjectMeta, se: &ServiceEntry) -> bool {
    se.resolution != Resolution::None
        && se.addresses.is_empty()
        && !meta
            .labels
            .get(ENABLE_AUTOALLOCATE_LABEL)
            .is_some_and(|v| v.eq_ignore_ascii_case("false"))
}

/// The hosts that get an address (Istio's `keepHost`): wildcards only
/// under DYNAMIC_DNS, which this istiod refuses.
pub fn allocated_hosts(se: &ServiceEntry) -> impl Iterator<Item = &String> {
    let mut seen = HashSet::new();
    se.hosts
        .iter()
        .filter(move |h| !h.starts_with('*') && seen.insert(h.as_str()))
}

/// The addresses of every qualifying entry's hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocations {
    /// Per entry, its hosts' addresses in host order (a short list: an
    /// entry has few hosts, and a map per entry would cost more).
    by_entry: HashMap<ObjectKey, Vec<(String, Vec<IpAddr>)>>,
}

impl Allocations {
    /// How many hosts got addresses (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_entry.values().map(Vec::len).sum()
    }

    /// The addresses of `host` of the entry `key` (IPv4 first), if any.
    pub fn addresses(&self, key: &ObjectKey, host: &str) -> &[IpAddr] {
        self.by_entry
            .get(key)
            .and_then(|hosts| hosts.iter().find(|(h, _)| h == host))
            .map(|(_, ips)| ips.as_slice())
            .unwrap_or_default()
    }

    /// The `status.addresses` an entry should hold, in host order.
    pub fn status_of(&self, key: &ObjectKey) -> Vec<super::istio::ServiceEntryAddress> {
        self.by_entry
            .get(key)
            .into_iter()
            .flatten()
            .flat_map(|(host, ips)| {
                ips.iter().map(|ip| super::istio::ServiceEntryAddress {
                    value: ip.to_string(),
                    host: host.clone(),
                })
            })
            .collect()
    }

    /// The address list of `host` of the entry `key`, created empty.
    fn list_mut(&mut self, key: &ObjectKey, host: &str) -> &mut Vec<IpAddr> {
        let hosts = self.by_entry.entry(key.clone()).or_default();
        let i = match hosts.iter().position(|(h, _)| h == host) {
            Some(i) => i,
            None => {
                hosts.push((host.to_string(), Vec::new()));
                hosts.len() - 1
            }
        };
        &mut hosts[i].1
    }
}

/// Which addresses are taken: by the user's `addresses` and by kept status
/// addresses.
#[derive(Default)]
struct Used {
    v4: HashSet<Ipv4Addr>,
    v6: HashSet<Ipv6Addr>,
}

impl Used {
    fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.contains(&a),
            IpAddr::V6(a) => self.v6.contains(&a),
        }
    }

    fn insert(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => self.v4.insert(a),
            IpAddr::V6(a) => self.v6.insert(a),
        };
    }

    /// The first free slot at or after `start` (wrapping), if any.
    fn free_slot(&self, start: u32) -> Option<u32> {
        (0..SLOTS)
            .map(|i| (start - 1 + i) % SLOTS + 1)
            .find(|&n| !self.v4.contains(&v4_of(n)) && !self.v6.contains(&v6_of(n)))
    }
}

/// Slot `n`'s IPv4 address.
pub fn v4_of(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(IPV4_PREFIX.0) + n)
}

/// Slot `n`'s IPv6 address.
pub fn v6_of(n: u32) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(IPV6_PREFIX.0) + u128::from(n))
}

fn in_prefixes(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => u32::from(a) >> (32 - IPV4_PREFIX.1) == u32::from(IPV4_PREFIX.0) >> 16,
        IpAddr::V6(a) => {
            u128::from(a) >> (128 - IPV6_PREFIX.1) == u128::from(IPV6_PREFIX.0) >> (128 - 48)
        }
    }
}

/// FNV-1a (32 bits): small, stable across releases and platforms.
fn fnv1a(parts: &[&str]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h ^= u32::from(b'/');
            h = h.wrapping_mul(0x0100_0193);
        }
        for b in p.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// The slot a host of an entry starts probing at.
pub fn home_slot(key: &ObjectKey, host: &str) -> u32 {
    fnv1a(&[&key.namespace, &key.name, host]) % SLOTS + 1
}

/// Allocates addresses for every qualifying ServiceEntry of `snapshot`.
pub fn allocate(snapshot: &Snapshot) -> Allocations {
    allocate_entries(snapshot.list::<ServiceEntry>())
}

/// [`allocate`] over any list of entries.
pub fn allocate_entries<'a>(entries: impl Iterator<Item = Typed<'a, ServiceEntry>>) -> Allocations {
    let mut entries: Vec<Typed<'a, ServiceEntry>> = entries.collect();
    // Oldest first (Istio's conflict rule), then by name for objects
    // without a creation time (files).
    entries.sort_by(|a, b| {
        let m = |t: &Typed<'a, ServiceEntry>| {
            let meta = &t.object.metadata;
            (
                meta.creation_timestamp.as_deref().unwrap_or_default(),
                meta.namespace.as_str(),
                meta.name.as_str(),
            )
        };
        m(a).cmp(&m(b))
    });
    let mut used = Used::default();
    // The user's own addresses in the ranges are never handed out.
    for e in &entries {
        for a in &e.spec.addresses {
            if let Ok(ip) = a.parse::<IpAddr>() {
                used.insert(ip);
            }
        }
    }
    let mut out = Allocations::default();
    // Addresses already written to a status stay, unless an older entry
    // (or a user's address) holds them.
    for e in &entries {
        if !should_allocate(&e.object.metadata, e.spec) {
            continue;
        }
        let key = e.object.key();
        let hosts: HashSet<&String> = allocated_hosts(e.spec).collect();
        for a in &e.spec.status_addresses {
            let Ok(ip) = a.value.parse::<IpAddr>() else {
                continue;
            };
            if !hosts.contains(&a.host) || !in_prefixes(ip) || used.contains(ip) {
                continue;
            }
            used.insert(ip);
            out.list_mut(&key, &a.host).push(ip);
        }
    }
    for e in &entries {
        if !should_allocate(&e.object.metadata, e.spec) {
            continue;
        }
        let key = e.object.key();
        for host in allocated_hosts(e.spec) {
            let kept = out.addresses(&key, host);
            let has_v4 = kept.iter().any(IpAddr::is_ipv4);
            let has_v6 = kept.iter().any(IpAddr::is_ipv6);
            if has_v4 && has_v6 {
                continue;
            }
            let Some(n) = used.free_slot(home_slot(&key, host)) else {
                tracing::warn!(target: "model", "{key}: no free address left in 240.240.0.0/16 for {host}");
                continue;
            };
            let list = out.list_mut(&key, host);
            if !has_v4 {
                used.insert(IpAddr::V4(v4_of(n)));
                list.push(IpAddr::V4(v4_of(n)));
            }
            if !has_v6 {
                used.insert(IpAddr::V6(v6_of(n)));
                list.push(IpAddr::V6(v6_of(n)));
            }
            list.sort_by_key(IpAddr::is_ipv6);
        }
    }
    for hosts in out.by_entry.values_mut() {
        hosts.sort_by(|a, b| a.0.cmp(&b.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ConfigStore, Kind, parse_file};
    use std::sync::Arc;

    fn allocations(yaml: &str) -> Allocations {
        let store = ConfigStore::new();
        let objects = parse_file("t.yaml", yaml).unwrap().objects;
        store.replace(objects.into_iter().map(Arc::new));
        allocate(&store.snapshot())
    }

    fn se(name: &str, extra: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  hosts: [{name}.example.com]\n  ports: [{{number: 3306, name: tcp, protocol: TCP}}]\n  resolution: DNS\n{extra}\n---\n"
        )
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Kind::ServiceEntry, "demo", name)
    }

    #[test]
    fn each_host_gets_a_v4_and_a_v6_address_in_istios_ranges_the_same_every_time() {
        let yaml = format!("{}{}", se("a", ""), se("b", ""));
        let first = allocations(&yaml);
        let a = first.addresses(&key("a"), "a.example.com").to_vec();
        let b = first.addresses(&key("b"), "b.example.com").to_vec();
        assert_eq!(a.len(), 2);
        assert!(a[0].to_string().starts_with("240.240."), "{a:?}");
        assert!(a[1].to_string().starts_with("2001:2::"), "{a:?}");
        assert_ne!(a, b, "distinct entries, distinct addresses");
        // Slot n is 240.240.0.0 + n and 2001:2:: + n.
        let IpAddr::V4(v4) = a[0] else { panic!() };
        let n = u32::from(v4) - u32::from(IPV4_PREFIX.0);
        assert_eq!(a[1], IpAddr::V6(v6_of(n)));
        // A restart (a new parse of the same objects) gives the same ones,
        // in whatever order the files come.
        let again = allocations(&format!("{}{}", se("b", ""), se("a", "")));
        assert_eq!(again, first);
    }

    #[test]
    fn entries_that_do_not_qualify_get_nothing() {
        let none = se("n", "").replace("resolution: DNS", "resolution: NONE");
        let given = se("g", "  addresses: [10.9.0.1]");
        let opted_out = se("o", "").replace(
            "namespace: demo}",
            "namespace: demo, labels: {networking.istio.io/enable-autoallocate-ip: \"False\"}}",
        );
        let wildcard = se("w", "  endpoints: [{address: 10.9.0.2}]")
            .replace("[w.example.com]", "['*.example.com', w.example.com]")
            .replace("resolution: DNS", "resolution: STATIC");
        let all = allocations(&format!("{none}{given}{opted_out}{wildcard}"));
        assert!(all.addresses(&key("n"), "n.example.com").is_empty());
        assert!(all.addresses(&key("g"), "g.example.com").is_empty());
        assert!(all.addresses(&key("o"), "o.example.com").is_empty());
        assert!(all.addresses(&key("w"), "*.example.com").is_empty());
        assert_eq!(all.addresses(&key("w"), "w.example.com").len(), 2);
        assert_eq!(all.len(), 1);
    }

    #[test]
    fn status_addresses_are_kept_and_a_conflict_moves_the_younger_entry() {
        let older = se("old", "").replace(
            "namespace: demo}",
            "namespace: demo, creationTimestamp: \"2024-01-01T00:00:00Z\"}",
        ) + "";
        let older = older.replace(
            "---\n",
            "status:\n  addresses: [{value: 240.240.0.7, host: old.example.com}]\n---\n",
        );
        let younger = se("young", "").replace(
            "namespace: demo}",
            "namespace: demo, creationTimestamp: \"2025-01-01T00:00:00Z\"}",
        );
        let younger = younger.replace(
            "---\n",
            "status:\n  addresses: [{value: 240.240.0.7, host: young.example.com}]\n---\n",
        );
        let all = allocations(&format!("{younger}{older}"));
        let old = all.addresses(&key("old"), "old.example.com");
        assert_eq!(
            old[0].to_string(),
            "240.240.0.7",
            "the older keeps its address"
        );
        assert_eq!(old.len(), 2, "and gets the IPv6 one it lacked");
        let young = all.addresses(&key("young"), "young.example.com");
        assert_ne!(young[0].to_string(), "240.240.0.7", "the younger moves");
        assert_eq!(
            all.status_of(&key("old"))
                .iter()
                .map(|a| a.value.as_str())
                .collect::<Vec<_>>()[0],
            "240.240.0.7"
        );
    }

    #[test]
    fn a_users_address_in_the_range_is_never_handed_out() {
        let mut used = Used::default();
        used.insert(IpAddr::V4(v4_of(5)));
        assert_eq!(used.free_slot(5), Some(6));
        assert_eq!(used.free_slot(SLOTS), Some(SLOTS), "the last slot");
        used.insert(IpAddr::V6(v6_of(SLOTS)));
        assert_eq!(used.free_slot(SLOTS), Some(1), "wraps around");
        assert!(in_prefixes("240.240.255.255".parse().unwrap()));
        assert!(!in_prefixes("240.241.0.1".parse().unwrap()));
        assert!(in_prefixes("2001:2::ffff".parse().unwrap()));
        assert!(!in_prefixes("2001:3::1".parse().unwrap()));
    }

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// IP auto-allocation for 5,000 ServiceEntries: the time to allocate
    /// and to build the service registry, and the memory the allocations
    /// hold, against the same entries with `addresses` given (nothing to
    /// allocate) in the same run. Prints; asserts nothing about speed.
    ///
    /// `cargo test -p istiod --lib bench_auto_allocation -- --ignored --nocapture`
    #[test]
    #[ignore = "a benchmark: run it by name"]
    fn bench_auto_allocation() {
        use crate::model::service::{RegistryOptions, ServiceRegistry};
        const N: usize = 5_000;
        const REPS: usize = 7;
        let store_of = |given: bool| {
            let mut yaml = String::new();
            for i in 0..N {
                let addresses = if given {
                    format!("  addresses: [10.{}.{}.1]\n", i / 256, i % 256)
                } else {
                    String::new()
                };
                yaml.push_str(&format!(
                    "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: se-{i}, namespace: ns-{}}}\nspec:\n  hosts: [db-{i}.bench.example]\n{addresses}  ports: [{{number: 3306, name: tcp, protocol: TCP}}]\n  resolution: STATIC\n  endpoints: [{{address: 10.200.{}.{}}}]\n---\n",
                    i % 50,
                    i / 256,
                    i % 256
                ));
            }
            let store = ConfigStore::new();
            store.replace(
                parse_file("bench.yaml", &yaml)
                    .unwrap()
                    .objects
                    .into_iter()
                    .map(Arc::new),
            );
            store.snapshot()
        };
        let median = |mut v: Vec<std::time::Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1000.0
        };
        let time = |f: &dyn Fn()| {
            median(
                (0..REPS)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        f();
                        t.elapsed()
                    })
                    .collect(),
            )
        };
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("load average: {}", load.trim());
        let options = RegistryOptions::default();
        let mut rows = Vec::new();
        for (label, given) in [
            ("addresses given (baseline)", true),
            ("auto-allocated", false),
        ] {
            let snapshot = store_of(given);
            let allocate_ms = time(&|| {
                std::hint::black_box(allocate(&snapshot));
            });
            let registry_ms = time(&|| {
                std::hint::black_box(ServiceRegistry::build(&snapshot, &options));
            });
            let before = rss_kib();
            let held: Vec<Allocations> = (0..10).map(|_| allocate(&snapshot)).collect();
            let kib = (rss_kib().saturating_sub(before)) as f64 / held.len() as f64;
            rows.push((label, held[0].len(), allocate_ms, registry_ms, kib));
        }
        println!(
            "| entries | hosts allocated | allocate ms | registry build ms | allocations KiB (RSS) |"
        );
        println!("|---|---:|---:|---:|---:|");
        for (label, hosts, a, r, kib) in &rows {
            println!("| {N} {label} | {hosts} | {a:.2} | {r:.2} | {kib:.0} |");
        }
        println!(
            "registry build with allocation / baseline: {:.2}",
            rows[1].3 / rows[0].3
        );
    }
}
