//! The command lines of `istio-iptables` and `istio-clean-iptables`: Istio's
//! flag names and short forms (`tools/istio-iptables/pkg/cmd/root.go`, and the
//! removed `tools/istio-clean-iptables/pkg/cmd/root.go`). Values stay text
//! here; `Config::from_args` (in `config.rs`) reads them with their
//! environment fallbacks and checks them.

use common::env::Env;

/// `INBOUND_INTERCEPTION_MODE`: the mode `istio-clean-iptables` reads (Istio's clean command only).
pub const ENV_INBOUND_INTERCEPTION_MODE: &str = "INBOUND_INTERCEPTION_MODE";
/// `INBOUND_TPROXY_MARK`: the mark `istio-clean-iptables` reads (Istio's clean command only).
pub const ENV_INBOUND_TPROXY_MARK: &str = "INBOUND_TPROXY_MARK";

/// The flags of `pilot-agent istio-iptables`, as Istio's `istio-iptables` has them.
/// Values are kept as text here and checked by `Config::from_args` (in `config.rs`), so one
/// run reports every bad value, each naming its flag. As with pflag, a flag
/// given twice takes the last value.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(args_override_self = true)]
pub struct IptablesArgs {
    /// Specify the envoy port to which redirect all TCP traffic.
    #[arg(short = 'p', long = "envoy-port")]
    pub envoy_port: Option<String>,
    /// Port to which all inbound TCP traffic to the pod/VM should be redirected to.
    #[arg(short = 'z', long = "inbound-capture-port")]
    pub inbound_capture_port: Option<String>,
    /// Specify the istio tunnel port for inbound tcp traffic.
    #[arg(short = 'e', long = "inbound-tunnel-port")]
    pub inbound_tunnel_port: Option<String>,
    /// Specify the UID of the user for which the redirection is not applied. Typically, this is the UID of the proxy container.
    #[arg(short = 'u', long = "proxy-uid")]
    pub proxy_uid: Option<String>,
    /// Specify the GID of the user for which the redirection is not applied (same default value as -u param).
    #[arg(short = 'g', long = "proxy-gid")]
    pub proxy_gid: Option<String>,
    /// The mode used to redirect inbound connections to Envoy, either "REDIRECT" or "TPROXY".
    #[arg(short = 'm', long = "istio-inbound-interception-mode")]
    pub inbound_interception_mode: Option<String>,
    /// Comma separated list of inbound ports for which traffic is to be redirected to Envoy (optional). The wildcard character "*" can be used to configure redirection for all ports. An empty list will disable.
    #[arg(short = 'b', long = "istio-inbound-ports")]
    pub inbound_ports: Option<String>,
    /// Comma separated list of inbound ports to be excluded from redirection to Envoy (optional). Only applies when all inbound traffic (i.e. "*") is being redirected.
    #[arg(short = 'd', long = "istio-local-exclude-ports")]
    pub local_exclude_ports: Option<String>,
    /// Comma separated list of NIC (optional). Neither inbound nor outbound traffic will be captured.
    #[arg(short = 'c', long = "istio-exclude-interfaces")]
    pub exclude_interfaces: Option<String>,
    /// Comma separated list of IP ranges in CIDR form to redirect to envoy (optional). The wildcard character "*" can be used to redirect all outbound traffic. An empty list will disable all outbound.
    #[arg(short = 'i', long = "istio-service-cidr")]
    pub service_cidr: Option<String>,
    /// Comma separated list of IP ranges in CIDR form to be excluded from redirection. Only applies when all  outbound traffic (i.e. "*") is being redirected.
    #[arg(short = 'x', long = "istio-service-exclude-cidr")]
    pub service_exclude_cidr: Option<String>,
    /// Comma separated list of outbound ports to be explicitly included for redirection to Envoy.
    #[arg(short = 'q', long = "istio-outbound-ports")]
    pub outbound_ports: Option<String>,
    /// Comma separated list of outbound ports to be excluded from redirection to Envoy.
    #[arg(short = 'o', long = "istio-local-outbound-ports-exclude")]
    pub local_outbound_ports_exclude: Option<String>,
    /// Comma separated list of virtual interfaces whose inbound traffic (from VM) will be treated as outbound.
    #[arg(short = 'k', long = "kube-virt-interfaces")]
    pub kube_virt_interfaces: Option<String>,
    /// The packet mark TPROXY sets on inbound traffic.
    #[arg(short = 't', long = "istio-inbound-tproxy-mark")]
    pub inbound_tproxy_mark: Option<String>,
    /// The routing table that sends TPROXY-marked packets to loopback.
    #[arg(short = 'r', long = "istio-inbound-tproxy-route-table")]
    pub inbound_tproxy_route_table: Option<String>,
    /// Do not call any external dependencies like iptables.
    #[arg(short = 'n', long = "dry-run", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub dry_run: Option<bool>,
    /// Set listen port for failure detection.
    #[arg(long = "iptables-probe-port")]
    pub iptables_probe_port: Option<String>,
    /// Failure detection timeout.
    #[arg(long = "probe-timeout")]
    pub probe_timeout: Option<String>,
    /// Skip iptables apply.
    #[arg(long = "skip-rule-apply", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub skip_rule_apply: Option<bool>,
    /// Validate iptables.
    #[arg(long = "run-validation", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub run_validation: Option<bool>,
    /// Enable capture of dns traffic by istio-agent.
    #[arg(long = "redirect-dns", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub redirect_dns: Option<bool>,
    /// Enable invalid drop in the iptables rules.
    #[arg(long = "drop-invalid", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub drop_invalid: Option<bool>,
    /// Enable ipv4/ipv6 redirects for dual-stack.
    #[arg(long = "dual-stack", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub dual_stack: Option<bool>,
    /// Instead of only capturing DNS traffic to DNS server IP, capture all DNS traffic at port 53. This setting is only effective when redirect dns is enabled.
    #[arg(long = "capture-all-dns", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub capture_all_dns: Option<bool>,
    /// The network namespace that iptables rules should be applied to.
    #[arg(long = "network-namespace")]
    pub network_namespace: Option<String>,
    /// Whether to run as CNI plugin.
    #[arg(long = "cni-mode", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub cni_mode: Option<bool>,
    /// Reconcile pre-existing and incompatible iptables rules instead of failing if drift is detected.
    #[arg(long = "reconcile", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub reconcile: Option<bool>,
    /// Perform a forced cleanup without creating new iptables chains or rules.
    #[arg(long = "cleanup-only", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub cleanup_only: Option<bool>,
    /// Apply iptables changes even if they appear to already be in place.
    #[arg(long = "force-apply", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub force_apply: Option<bool>,
    /// Use native nftables instead of iptables rules (not supported here).
    #[arg(long = "native-nftables", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub native_nftables: Option<bool>,
    /// Break glass option to choose which iptables binary to use: legacy or nft.
    #[arg(long = "force-iptables-binary")]
    pub force_iptables_binary: Option<String>,
}

/// The flags of `pilot-agent istio-clean-iptables`, as Istio's removed
/// `istio-clean-iptables` had them.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(args_override_self = true)]
pub struct CleanArgs {
    /// Do not call any external dependencies like iptables.
    #[arg(short = 'n', long = "dry-run", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub dry_run: Option<bool>,
    /// Specify the UID of the user for which the redirection is not applied. Typically, this is the UID of the proxy container.
    #[arg(short = 'u', long = "proxy-uid")]
    pub proxy_uid: Option<String>,
    /// Specify the GID of the user for which the redirection is not applied (same default value as -u param).
    #[arg(short = 'g', long = "proxy-gid")]
    pub proxy_gid: Option<String>,
    /// Enable capture of dns traffic by istio-agent.
    #[arg(long = "redirect-dns", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub redirect_dns: Option<bool>,
    /// Instead of only capturing DNS traffic to DNS server IP, capture all DNS traffic at port 53. This setting is only effective when redirect dns is enabled.
    #[arg(long = "capture-all-dns", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = common::cli::parse_go_bool)]
    pub capture_all_dns: Option<bool>,
    /// The mode used to redirect inbound connections to Envoy, either "REDIRECT" or "TPROXY".
    #[arg(short = 'm', long = "istio-inbound-interception-mode")]
    pub inbound_interception_mode: Option<String>,
    /// The packet mark TPROXY sets on inbound traffic.
    #[arg(short = 't', long = "istio-inbound-tproxy-mark")]
    pub inbound_tproxy_mark: Option<String>,
}

impl CleanArgs {
    /// The `istio-iptables` flags these stand for (the rest at their defaults).
    /// The clean command also reads `INBOUND_INTERCEPTION_MODE` and
    /// `INBOUND_TPROXY_MARK`, as Istio's did; here a flag still wins over them.
    pub fn to_iptables_args(&self, env: &dyn Env) -> IptablesArgs {
        let env_value = |name: &str| env.get(name).filter(|v| !v.is_empty());
        IptablesArgs {
            dry_run: self.dry_run,
            proxy_uid: self.proxy_uid.clone(),
            proxy_gid: self.proxy_gid.clone(),
            redirect_dns: self.redirect_dns,
            capture_all_dns: self.capture_all_dns,
            inbound_interception_mode: self
                .inbound_interception_mode
                .clone()
                .or_else(|| env_value(ENV_INBOUND_INTERCEPTION_MODE)),
            inbound_tproxy_mark: self
                .inbound_tproxy_mark
                .clone()
                .or_else(|| env_value(ENV_INBOUND_TPROXY_MARK)),
            ..IptablesArgs::default()
        }
    }
}
