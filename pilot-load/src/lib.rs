//! Load for istiod, in the spirit of Istio's `pilot-load`: [`mesh`] writes a
//! mesh of a given shape into a config directory, [`client`] simulates
//! proxies (state of the world and delta ADS), and [`run`] connects them to
//! a running istiod, applies changes and measures each push: time to every
//! proxy's ACK, bytes, and istiod's CPU and memory ([`procfs`]).

pub mod client;
pub mod mesh;
pub mod procfs;
pub mod run;
pub mod wire;
