//! Test backends outside the mesh that gateway tests route to: a TLS
//! server that terminates TLS itself, a TCP echo server, and the TLS client
//! that checks whose certificate answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::netns::Netns;

/// A TLS server outside the mesh that terminates TLS itself with `cert`
/// and answers the first bytes it reads with `tls-backend:<SNI>:<bytes>`.
pub fn tls_backend(ns: &Netns, addr: SocketAddr, cert: &str, key: &str) {
    common::tls::install_crypto_provider();
    let chain = common::pki::pem_certs("server", cert).unwrap();
    let key = {
        use rustls_pki_types::pem::PemObject as _;
        rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap()
    };
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for sock in listener.incoming().take(10_000) {
            let Ok(mut sock) = sock else { continue };
            let config = config.clone();
            std::thread::spawn(move || {
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let mut conn = rustls::ServerConnection::new(config).unwrap();
                if conn.complete_io(&mut sock).is_err() {
                    return;
                }
                let sni = conn.server_name().unwrap_or("none").to_string();
                let mut tls = rustls::Stream::new(&mut conn, &mut sock);
                let mut buf = [0u8; 256];
                let Ok(n) = tls.read(&mut buf) else { return };
                let reply = format!("tls-backend:{sni}:{}", String::from_utf8_lossy(&buf[..n]));
                let _ = tls.write_all(reply.as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
}

/// A TCP server outside the mesh: answers each read with `echo:<bytes>`.
pub fn echo_backend(ns: &Netns, addr: SocketAddr) {
    let listener = ns.run(move || std::net::TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for sock in listener.incoming().take(10_000) {
            let Ok(mut sock) = sock else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                while let Ok(n) = sock.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let mut reply = b"echo:".to_vec();
                    reply.extend_from_slice(&buf[..n]);
                    if sock.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// A TLS client in `ns`: connects to `addr` with `sni`, verifies the
/// server against `ca_pem` for that name, sends `hello` and reads the
/// answer to its end. Returns (the leaf certificate's DER, the answer), or
/// the I/O error the handshake or exchange ended with.
pub fn tls_exchange(
    ns: &Netns,
    addr: SocketAddr,
    sni: &str,
    ca_pem: &str,
) -> std::io::Result<(Vec<u8>, String)> {
    common::tls::install_crypto_provider();
    let roots = common::tls::root_store("backend CA", ca_pem).unwrap();
    let config = Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    ns.run(move || {
        let mut conn = rustls::ClientConnection::new(config, name).unwrap();
        let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        sock.set_read_timeout(Some(Duration::from_secs(10)))?;
        conn.complete_io(&mut sock)?;
        let leaf = conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default();
        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
        tls.write_all(b"hello")?;
        let mut answer = String::new();
        tls.read_to_string(&mut answer)?;
        Ok((leaf, answer))
    })
}
