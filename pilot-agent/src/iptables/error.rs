//! Why an `istio-iptables` configuration cannot be used: a bad flag or
//! variable, or a fact of the host that cannot be read.

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// One or more flags or variables have values that cannot be used.
    #[error("invalid istio-iptables configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
    /// Istio's `getLocalIP` found no usable address.
    #[error(
        "no valid local IP address found (the Pod needs a non-loopback, non-link-local address)"
    )]
    NoLocalIp,
    /// The interfaces could not be listed.
    #[error("failed to list the network interfaces' addresses: {0}")]
    Interfaces(#[source] nix::Error),
    /// `/etc/resolv.conf` could not be read while `--redirect-dns` needs it.
    #[error("failed to load /etc/resolv.conf: {0}")]
    ResolvConf(#[source] std::io::Error),
}
