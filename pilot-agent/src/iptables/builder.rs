//! The rule builder (Istio's `tools/istio-iptables/pkg/builder`): rules are
//! recorded per IP family in the order they are added, then rendered as
//! `iptables-restore` input, as check commands (`-C`), or as the commands that
//! undo them. The same ordering rules as Istio's make the output identical to
//! what Istio feeds `iptables-restore`.

use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Placeholder replaced by the family's address in a versioned rule.
pub const IP_VERSION_SPECIFIC: &str = "PLACEHOLDER_IP_VERSION_SPECIFIC";

/// Chains and targets iptables defines itself: never created or deleted.
pub const BUILT_IN_CHAINS_AND_TARGETS: &[&str] = &[
    "INPUT",
    "OUTPUT",
    "FORWARD",
    "PREROUTING",
    "POSTROUTING",
    "ACCEPT",
    "RETURN",
    "DROP",
];

/// Istio's chains.
pub mod chain {
    /// `ISTIO_OUTPUT`.
    pub const OUTPUT: &str = "ISTIO_OUTPUT";
    /// `ISTIO_OUTPUT_DNS`.
    pub const OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
    /// `ISTIO_INBOUND`.
    pub const INBOUND: &str = "ISTIO_INBOUND";
    /// `ISTIO_DIVERT`.
    pub const DIVERT: &str = "ISTIO_DIVERT";
    /// `ISTIO_TPROXY`.
    pub const TPROXY: &str = "ISTIO_TPROXY";
    /// `ISTIO_REDIRECT`.
    pub const REDIRECT: &str = "ISTIO_REDIRECT";
    /// `ISTIO_IN_REDIRECT`.
    pub const IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
    /// `ISTIO_DROP`.
    pub const DROP: &str = "ISTIO_DROP";
}

fn is_built_in(name: &str) -> bool {
    BUILT_IN_CHAINS_AND_TARGETS.contains(&name)
}

/// One rule: its chain, table and the full parameters (`-A CHAIN ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The chain the rule lives in.
    pub chain: String,
    /// The table.
    pub table: String,
    /// `-A chain ...` or `-I chain pos ...`.
    pub params: Vec<String>,
}

/// An iptables command line without the binary: `-t table ...`.
pub type Command = Vec<String>;

/// Records rules for IPv4 and, when enabled, IPv6.
#[derive(Debug, Clone, Default)]
pub struct RuleBuilder {
    v4: Vec<Rule>,
    v6: Vec<Rule>,
    enable_ipv6: bool,
}

impl RuleBuilder {
    /// A builder that records IPv6 rules only when `enable_ipv6`.
    pub fn new(enable_ipv6: bool) -> Self {
        Self {
            v4: Vec::new(),
            v6: Vec::new(),
            enable_ipv6,
        }
    }

    fn push(
        list: &mut Vec<Rule>,
        chain: &str,
        table: &str,
        head: Vec<String>,
        params: Vec<String>,
    ) {
        let mut all = head;
        all.extend(params);
        list.push(Rule {
            chain: chain.to_string(),
            table: table.to_string(),
            params: all,
        });
    }

    /// Appends to both families.
    pub fn append(&mut self, chain: &str, table: &str, params: Vec<String>) {
        self.append_v6(chain, table, params.clone());
        self.append_v4(chain, table, params);
    }

    /// Appends an IPv4 rule.
    pub fn append_v4(&mut self, chain: &str, table: &str, params: Vec<String>) {
        Self::push(&mut self.v4, chain, table, ipt_args!["-A", chain], params);
    }

    /// Appends an IPv6 rule (only when IPv6 is on).
    pub fn append_v6(&mut self, chain: &str, table: &str, params: Vec<String>) {
        if self.enable_ipv6 {
            Self::push(&mut self.v6, chain, table, ipt_args!["-A", chain], params);
        }
    }

    /// Inserts at `position` in both families.
    pub fn insert(&mut self, chain: &str, table: &str, position: u32, params: Vec<String>) {
        self.insert_v6(chain, table, position, params.clone());
        self.insert_v4(chain, table, position, params);
    }

    /// Inserts an IPv4 rule at `position`.
    pub fn insert_v4(&mut self, chain: &str, table: &str, position: u32, params: Vec<String>) {
        Self::push(
            &mut self.v4,
            chain,
            table,
            ipt_args!["-I", chain, position],
            params,
        );
    }

    /// Inserts an IPv6 rule at `position` (only when IPv6 is on).
    pub fn insert_v6(&mut self, chain: &str, table: &str, position: u32, params: Vec<String>) {
        if self.enable_ipv6 {
            Self::push(
                &mut self.v6,
                chain,
                table,
                ipt_args!["-I", chain, position],
                params,
            );
        }
    }

    /// Appends a rule to both families, with [`IP_VERSION_SPECIFIC`] replaced
    /// by `ipv4` or `ipv6`.
    pub fn append_versioned(
        &mut self,
        ipv4: &str,
        ipv6: &str,
        chain: &str,
        table: &str,
        params: Vec<String>,
    ) {
        let with = |addr: &str| {
            params
                .iter()
                .map(|p| {
                    if p == IP_VERSION_SPECIFIC {
                        addr.to_string()
                    } else {
                        p.clone()
                    }
                })
                .collect::<Vec<_>>()
        };
        self.append_v4(chain, table, with(ipv4));
        self.append_v6(chain, table, with(ipv6));
    }

    /// The `iptables-restore` input for IPv4.
    pub fn build_v4_restore(&self) -> String {
        build_restore(&self.v4)
    }

    /// The `ip6tables-restore` input for IPv6 (empty when IPv6 is off).
    pub fn build_v6_restore(&self) -> String {
        build_restore(&self.v6)
    }

    /// `-C` commands checking that every IPv4 rule exists.
    pub fn build_check_v4(&self) -> Vec<Command> {
        check_commands(&self.v4)
    }

    /// `-C` commands checking that every IPv6 rule exists.
    pub fn build_check_v6(&self) -> Vec<Command> {
        check_commands(&self.v6)
    }

    /// Commands undoing the IPv4 rules: delete the rules of built-in chains and
    /// the jumps, then flush and delete Istio's chains.
    pub fn build_cleanup_v4(&self) -> Vec<Command> {
        cleanup_commands(&self.v4)
    }

    /// Commands undoing the IPv6 rules.
    pub fn build_cleanup_v6(&self) -> Vec<Command> {
        cleanup_commands(&self.v6)
    }
}

/// Istio's `buildRestore`: per table (sorted by name), first `-N` for every
/// non-built-in chain in order of first use, then for chains only jumped to,
/// then the rules in order.
fn build_restore(rules: &[Rule]) -> String {
    let mut tables: BTreeMap<&str, Vec<String>> = ["filter", "nat", "mangle"]
        .into_iter()
        .map(|t| (t, Vec::new()))
        .collect();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    for r in rules {
        if seen.insert((r.chain.as_str(), r.table.as_str())) && !is_built_in(&r.chain) {
            tables
                .entry(&r.table)
                .or_default()
                .push(format!("-N {}", r.chain));
        }
    }
    for r in rules {
        let n = r.params.len();
        if n >= 2 && r.params[n - 2] == "-j" {
            let target = r.params[n - 1].as_str();
            if seen.insert((target, r.table.as_str())) && !is_built_in(target) {
                tables
                    .entry(&r.table)
                    .or_default()
                    .push(format!("-N {target}"));
            }
        }
    }
    for r in rules {
        tables.entry(&r.table).or_default().push(r.params.join(" "));
    }
    let mut out = String::new();
    for (table, lines) in tables {
        if lines.is_empty() {
            continue;
        }
        out.push_str(&format!("* {table}\n"));
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Replaces `-A`/`-I chain pos` by `op chain`.
fn with_op(params: &[String], op: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(params.len());
    let mut skip_at = None;
    for (i, p) in params.iter().enumerate() {
        if Some(i) == skip_at {
            continue;
        }
        match p.as_str() {
            "-A" | "--append" => out.push(op.to_string()),
            "-I" | "--insert" => {
                skip_at = Some(i + 2);
                out.push(op.to_string());
            }
            _ => out.push(p.clone()),
        }
    }
    out
}

fn with_table(table: &str, params: Vec<String>) -> Command {
    let mut cmd = ipt_args!["-t", table];
    cmd.extend(params);
    cmd
}

fn check_commands(rules: &[Rule]) -> Vec<Command> {
    rules
        .iter()
        .map(|r| with_table(&r.table, with_op(&r.params, "-C")))
        .collect()
}

/// Istio's `UndoRules`: `-D` for every rule, except rules inside Istio's
/// chains (flushed anyway) that are not jumps to another Istio chain.
pub fn undo_rules(rules: &[Rule]) -> Vec<Rule> {
    rules
        .iter()
        .filter(|r| {
            let p = &r.params;
            let in_istio_chain = p.len() > 1
                && matches!(p[0].as_str(), "-A" | "--append" | "-I" | "--insert")
                && p[1].starts_with("ISTIO_");
            let jumps_to_istio = p
                .windows(2)
                .any(|w| matches!(w[0].as_str(), "-j" | "--jump") && w[1].starts_with("ISTIO_"));
            !in_istio_chain || jumps_to_istio
        })
        .map(|r| Rule {
            chain: r.chain.clone(),
            table: r.table.clone(),
            params: with_op(&r.params, "-D"),
        })
        .collect()
}

/// Istio's `buildCleanupRules`: the undo rules in reverse order, then `-F`
/// and `-X` for each Istio chain (last used first).
fn cleanup_commands(rules: &[Rule]) -> Vec<Command> {
    let reversed: Vec<Rule> = rules.iter().rev().cloned().collect();
    let mut out: Vec<Command> = undo_rules(&reversed)
        .into_iter()
        .map(|r| with_table(&r.table, r.params))
        .collect();
    let mut seen = HashSet::new();
    for r in &reversed {
        if seen.insert((r.chain.clone(), r.table.clone())) && !is_built_in(&r.chain) {
            out.push(ipt_args!["-t", r.table, "-F", r.chain]);
            out.push(ipt_args!["-t", r.table, "-X", r.chain]);
        }
    }
    out
}

fn guardrail_rules() -> Vec<Rule> {
    let mut rules = Vec::new();
    for chain in ["INPUT", "FORWARD", "OUTPUT"] {
        for proto in ["tcp", "udp"] {
            RuleBuilder::push(
                &mut rules,
                chain,
                "filter",
                ipt_args!["-I", chain, 1],
                ipt_args!["-p", proto, "-j", "DROP"],
            );
        }
    }
    rules
}

/// Istio's guardrails: drop TCP and UDP while rules are being replaced.
pub fn build_guardrails() -> Vec<Command> {
    guardrail_rules()
        .into_iter()
        .map(|r| with_table(&r.table, r.params))
        .collect()
}

/// Commands removing the guardrails.
pub fn build_cleanup_guardrails() -> Vec<Command> {
    undo_rules(&guardrail_rules())
        .into_iter()
        .map(|r| with_table(&r.table, r.params))
        .collect()
}

/// Tables -> chains -> rule lines, as Istio's `GetStateFromSave` reads them.
pub type State = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Istio's `GetStateFromSave`: from restore or save text, the Istio chains
/// (even empty) and every chain holding rules, per built-in table.
pub fn state_from_save(data: &str) -> State {
    let mut state: State = ["filter", "nat", "mangle", "raw"]
        .into_iter()
        .map(|t| (t.to_string(), BTreeMap::new()))
        .collect();
    let mut table = String::new();
    for line in data.lines() {
        if line.trim().is_empty() || line.starts_with('#') || line == "COMMIT" {
            continue;
        }
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
            continue;
        }
        let Some(chains) = state.get_mut(&table) else {
            continue;
        };
        if let Some(decl) = line.strip_prefix(':') {
            if decl.starts_with("ISTIO") {
                let name = decl.split(' ').next().unwrap_or_default();
                chains.entry(name.to_string()).or_default();
            }
            continue;
        }
        let words: Vec<&str> = line.split(' ').collect();
        let mut rule_chain = None;
        let mut add = false;
        for (i, w) in words.iter().enumerate() {
            let Some(next) = words.get(i + 1) else { break };
            let next = next.trim_matches(|c| c == '\'' || c == '"');
            match *w {
                "--append" | "-A" | "--insert" | "-I" => {
                    add = true;
                    rule_chain = Some(next);
                }
                "--new" | "-N" if next.starts_with("ISTIO") => rule_chain = Some(next),
                _ => {}
            }
        }
        if let Some(c) = rule_chain {
            let rules = chains.entry(c.to_string()).or_default();
            if add {
                rules.push(line.to_string());
            }
        }
    }
    state
}

/// Istio's leftovers of one table: its `ISTIO_` chains and the jumps into them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// `ISTIO_` chains.
    pub chains: Vec<String>,
    /// Rules (anywhere) jumping to an `ISTIO_` chain.
    pub rules: Vec<String>,
}

/// Istio's `HasIstioLeftovers`: tables holding Istio chains or jumps.
pub fn istio_leftovers(state: &State) -> BTreeMap<String, Leftovers> {
    let mut out = BTreeMap::new();
    for (table, chains) in state {
        let mut l = Leftovers::default();
        for (chain, rules) in chains {
            if chain.starts_with("ISTIO_") {
                l.chains.push(chain.clone());
            }
            l.rules
                .extend(rules.iter().filter(|r| is_istio_jump(r)).cloned());
        }
        if !l.chains.is_empty() || !l.rules.is_empty() {
            out.insert(table.clone(), l);
        }
    }
    out
}

fn is_istio_jump(rule: &str) -> bool {
    let fields: Vec<&str> = rule.split_whitespace().collect();
    fields
        .iter()
        .position(|f| *f == "-j" || *f == "--jump")
        .and_then(|i| fields.get(i + 1))
        .is_some_and(|t| {
            t.trim_matches(|c| c == '\'' || c == '"')
                .starts_with("ISTIO_")
        })
}

/// Istio's `BuildCleanupFromState`, ordered so it always completes: delete
/// the jumps, flush every Istio chain, then delete them (a chain still
/// referenced by another cannot be deleted).
pub fn build_cleanup_from_state(leftovers: &BTreeMap<String, Leftovers>) -> Vec<Command> {
    let mut rules = Vec::new();
    for (table, l) in leftovers {
        for line in &l.rules {
            let params: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            rules.push(Rule {
                chain: String::new(),
                table: table.clone(),
                params,
            });
        }
    }
    let mut out: Vec<Command> = undo_rules(&rules)
        .into_iter()
        .map(|r| with_table(&r.table, r.params))
        .collect();
    let chains: BTreeSet<(&String, &String)> = leftovers
        .iter()
        .flat_map(|(t, l)| l.chains.iter().map(move |c| (t, c)))
        .collect();
    out.extend(chains.iter().map(|(t, c)| ipt_args!["-t", t, "-F", c]));
    out.extend(chains.iter().map(|(t, c)| ipt_args!["-t", t, "-X", c]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RuleBuilder {
        let mut b = RuleBuilder::new(false);
        b.append("OUTPUT", "nat", ipt_args!["-j", chain::OUTPUT]);
        b.append(chain::OUTPUT, "nat", ipt_args!["-j", chain::REDIRECT]);
        b.append(
            chain::REDIRECT,
            "nat",
            ipt_args!["-p", "tcp", "-j", "REDIRECT", "--to-ports", 15001],
        );
        b.insert(
            "PREROUTING",
            "nat",
            1,
            ipt_args!["-i", "eth1", "-j", "RETURN"],
        );
        b
    }

    #[test]
    fn restore_declares_chains_then_rules() {
        assert_eq!(
            sample().build_v4_restore(),
            "* nat\n-N ISTIO_OUTPUT\n-N ISTIO_REDIRECT\n-A OUTPUT -j ISTIO_OUTPUT\n\
             -A ISTIO_OUTPUT -j ISTIO_REDIRECT\n-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001\n\
             -I PREROUTING 1 -i eth1 -j RETURN\nCOMMIT\n"
        );
        assert_eq!(sample().build_v6_restore(), "");
    }

    #[test]
    fn cleanup_undoes_jumps_and_builtin_rules_then_removes_chains() {
        let cmds: Vec<String> = sample()
            .build_cleanup_v4()
            .iter()
            .map(|c| c.join(" "))
            .collect();
        assert_eq!(
            cmds,
            [
                "-t nat -D PREROUTING -i eth1 -j RETURN",
                "-t nat -D ISTIO_OUTPUT -j ISTIO_REDIRECT",
                "-t nat -D OUTPUT -j ISTIO_OUTPUT",
                "-t nat -F ISTIO_REDIRECT",
                "-t nat -X ISTIO_REDIRECT",
                "-t nat -F ISTIO_OUTPUT",
                "-t nat -X ISTIO_OUTPUT",
            ]
        );
    }

    #[test]
    fn leftovers_from_save_output() {
        let save = "# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_REDIRECT - [0:0]\n\
                    -A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -d 1.1.1.1/32 -j ISTIO_REDIRECT\nCOMMIT\n";
        let l = istio_leftovers(&state_from_save(save));
        let cmds: Vec<String> = build_cleanup_from_state(&l)
            .iter()
            .map(|c| c.join(" "))
            .collect();
        assert_eq!(
            cmds,
            [
                "-t nat -D ISTIO_OUTPUT -d 1.1.1.1/32 -j ISTIO_REDIRECT",
                "-t nat -D OUTPUT -j ISTIO_OUTPUT",
                "-t nat -F ISTIO_OUTPUT",
                "-t nat -F ISTIO_REDIRECT",
                "-t nat -X ISTIO_OUTPUT",
                "-t nat -X ISTIO_REDIRECT",
            ]
        );
    }
}
