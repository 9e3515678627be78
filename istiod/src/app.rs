//! The composition root: builds every part of istiod from its `Config`, binds
//! the listeners and returns their real addresses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::get;
use proto::istio_ca::istio_certificate_service_server::IstioCertificateServiceServer;
use rustls::pki_types::PrivateKeyDer;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;

use crate::ca::authn::{Authenticators, JwtAuthenticator};
use crate::ca::authority::Authority;
use crate::ca::kube_jwt::KubeJwtAuthenticator;
use crate::ca::server::CaServer;
use crate::ca::serving_cert::ServingCert;
use crate::config::Config;
use crate::jwks::JwksResolver;
use crate::mesh::Mesh;
use crate::metrics::{self, CaMetrics};
use crate::model::{ConfigBatch, RegistryOptions};
use crate::push::{Inputs, Trigger};

/// The running istiod.
pub struct Bound {
    /// The TLS gRPC (xDS + CA) address.
    pub secure_grpc_addr: Option<SocketAddr>,
    /// The readiness/debug HTTP address.
    pub http_addr: Option<SocketAddr>,
    /// The monitoring address.
    pub monitoring_addr: Option<SocketAddr>,
    /// The plaintext xDS address.
    pub grpc_addr: Option<SocketAddr>,
    /// The webhook (HTTPS) address.
    pub https_addr: Option<SocketAddr>,
    /// The CA root bundle (what `istio-ca-root-cert` carries).
    pub root_pem: String,
    shutdown: watch::Sender<bool>,
    /// The CA; publishes the root bundle while istiod runs.
    _authority: Arc<Authority>,
    tasks: JoinSet<anyhow::Result<()>>,
    shutdown_duration: Duration,
    /// Closes the open xDS streams (after the servers stopped accepting).
    closing: watch::Sender<bool>,
    /// The leader elections, released at shutdown.
    elections: Option<crate::leaderelection::Elections>,
}

impl Bound {
    /// Stops every server gracefully, waiting at most `--shutdownDuration`.
    pub async fn shutdown(mut self) {
        // Stop accepting (GOAWAY on open connections) and release the
        // leader locks; a moment later close the xDS streams still open.
        let _ = self.shutdown.send(true);
        let start = tokio::time::Instant::now();
        let closing = self.closing.clone();
        let close_delay = crate::xds::drain::CLOSE_DELAY.min(self.shutdown_duration / 2);
        tokio::spawn(async move {
            tokio::time::sleep(close_delay).await;
            let _ = closing.send(true);
        });
        let deadline = tokio::time::sleep(self.shutdown_duration);
        tokio::pin!(deadline);
        if let Some(elections) = self.elections.take() {
            elections.released(self.shutdown_duration / 2).await;
        }
        loop {
            tokio::select! {
                next = self.tasks.join_next() => if next.is_none() { break },
                _ = &mut deadline => {
                    tracing::warn!("shutdown took longer than {:?}; stopping now", self.shutdown_duration);
                    self.tasks.abort_all();
                    break;
                }
            }
        }
        tracing::info!("shut down in {:?}", start.elapsed());
    }

    /// Runs until a server fails or SIGTERM/SIGINT arrives, then shuts down.
    pub async fn wait_termination(mut self) -> anyhow::Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let result = tokio::select! {
            _ = term.recv() => { tracing::info!("received signal: terminated; shutting down"); Ok(()) }
            _ = tokio::signal::ctrl_c() => { tracing::info!("received signal: interrupt; shutting down"); Ok(()) }
            Some(res) = self.tasks.join_next() => match res {
                Ok(Ok(())) => Err(anyhow::anyhow!("a server stopped unexpectedly")),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("a server task failed: {e}")),
            },
        };
        self.shutdown().await;
        result
    }
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for {what}: is another process using it?")
    })
}

async fn shutdown_signal(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Wires the sources to the push pipeline: the store's change batches, a
/// full push when the mesh config the generators apply changes, and one when
/// RequestAuthentication's `jwksUri` keys change. Returns the JWKS resolver
/// the push contexts read those keys from.
fn push_inputs(
    batches: broadcast::Receiver<ConfigBatch>,
    mesh: &watch::Receiver<Arc<Mesh>>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(Inputs, Arc<JwksResolver>)> {
    let (tx, triggers) = mpsc::channel(16);
    // A changed mesh config changes what every proxy gets: a full push.
    {
        let mut mesh = mesh.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut applied = mesh.borrow_and_update().config.clone();
            while mesh.changed().await.is_ok() {
                let current = mesh.borrow_and_update().config.clone();
                if current == applied {
                    continue;
                }
                applied = current;
                if tx.send(Trigger::Mesh).await.is_err() {
                    return;
                }
            }
        });
    }

    // RequestAuthentication's `jwksUri` keys, fetched in the background; a
    // change of keys is a full push (Istio's `JwksResolver.PushFunc`).
    let jwks = Arc::new(JwksResolver::new());
    {
        let refresh = crate::jwks::resolver::refresh_interval(&common::env::ProcessEnv)?;
        let on_change = move || {
            if let Err(e) = tx.try_send(Trigger::Jwks) {
                tracing::warn!(target: "authn", "cannot queue the push for changed JWT public keys: {e}");
            }
        };
        tokio::spawn(jwks.clone().run(refresh, on_change, shutdown));
    }
    Ok((Inputs { batches, triggers }, jwks))
}

/// Builds and starts istiod.
pub async fn build(config: Arc<Config>) -> anyhow::Result<Bound> {
    common::tls::install_crypto_provider();
    // Before any source or webhook validates an object.
    crate::model::features::publish(config.features);
    let registry = prometheus::Registry::new();
    let ca_metrics = Arc::new(CaMetrics::new(&registry)?);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::spawn(crate::scavenger::run(
        crate::scavenger::INTERVAL,
        shutdown_rx.clone(),
    ));

    let kube = match &config.registry.kube {
        Some(connection) => Some(crate::kube::client(connection).await?),
        None => None,
    };
    let mut elections = crate::leaderelection::Elections::new(
        crate::leaderelection::candidate(
            &config.mesh.namespace,
            &config.server.pod_name,
            &config.webhooks.revision,
            kube.as_ref(),
            shutdown_rx.clone(),
        )?,
        shutdown_rx.clone(),
    );
    let ca_settings = config.ca_settings();
    let (bundle, ca_source) = crate::ca::istio_ca::load(&ca_settings, kube.as_ref()).await?;
    let authority = Arc::new(Authority::new(
        bundle,
        config.ca.default_cert_ttl,
        config.ca.max_cert_ttl,
    )?);
    let root_pem = authority.root_pem();
    crate::ca::istio_ca::keep_current(
        &ca_source,
        &ca_settings,
        kube.as_ref(),
        &authority,
        shutdown_rx.clone(),
    );

    // istiod's own serving certificate for :15012 and :15017, issued again
    // by the CA whenever its material changes.
    let custom = match &config.server.custom_tls {
        Some(crate::config::CustomTls { cert, key, .. }) => {
            let chain_pem = std::fs::read_to_string(cert)
                .with_context(|| format!("--tlsCertFile {}", cert.display()))?;
            let key_pem = std::fs::read_to_string(key)
                .with_context(|| format!("--tlsKeyFile {}", key.display()))?;
            let chain = common::pki::pem_certs(&cert.display().to_string(), &chain_pem)?;
            let key = <PrivateKeyDer<'_> as rustls::pki_types::pem::PemObject>::from_pem_slice(
                key_pem.as_bytes(),
            )
            .with_context(|| format!("--tlsKeyFile {}: no PEM private key", key.display()))?;
            Some((chain, key))
        }
        None => None,
    };
    let serving = ServingCert::new(
        &authority,
        &config.server.istiod_sans,
        config.ca.self_signed_ca_ttl,
        custom,
    )?;
    tokio::spawn(
        serving
            .clone()
            .follow(authority.clone(), shutdown_rx.clone()),
    );
    tracing::info!(target: "ca", "istiod serving certificate SANs: {}", config.server.istiod_sans.join(", "));

    let jwt = config.ca.jwt_rule.clone().map(|rule| {
        tracing::info!(target: "authn", "trusting tokens from issuer {} (keys at {})", rule.issuer, rule.jwks_uri);
        Arc::new(JwtAuthenticator::new(rule, &config.mesh.trust_domain))
    });
    let kube_jwt = kube.as_ref().map(|client| {
        tracing::info!(target: "authn", "reviewing bearer tokens with the Kubernetes API ({:?}, audiences {:?})", config.ca.jwt_policy, config.ca.token_audiences);
        Arc::new(KubeJwtAuthenticator::new(
            client.clone(),
            config.ca.jwt_policy,
            config.ca.token_audiences.clone(),
            &config.mesh.trust_domain,
        ))
    });
    let authenticators = Authenticators {
        client_cert: true,
        jwt,
        kube: kube_jwt,
    };

    // The xDS server, fed by the push pipeline; it refuses streams until ready.
    let xds_metrics = crate::xds::server::XdsMetrics::new(&registry)?;
    let push_metrics = crate::push::PushMetrics::new(&registry)?;
    let (ready_tx, ready_rx) = watch::channel(false);
    let (closing, closing_rx) = watch::channel(false);
    let (push_tx, push_rx) = watch::channel(None);
    let xds = crate::xds::server::DiscoveryServer::new(
        ready_rx.clone(),
        push_rx,
        xds_metrics,
        config.push.throttle,
    )
    .with_send_timeout(config.push.send_timeout)
    .with_instance(&config.mesh.namespace, &config.server.pod_name)
    .with_stream_limit(config.push.max_requests_per_second)
    .with_drain(crate::xds::drain::Drain::new(
        closing_rx,
        config.server.max_connection_age,
    ));
    let cache_metrics = if config.xds_cache.stats {
        Some(crate::pushctx::cache::CacheMetrics::new(&registry)?)
    } else {
        None
    };
    crate::xds::envoyfilter::register_metrics(&registry)?;
    let cache = Arc::new(crate::pushctx::cache::XdsCache::new(
        config.xds_cache.clone(),
        cache_metrics,
    ));
    let sources = crate::source::start(
        config.source_settings(),
        kube.clone(),
        shutdown_rx.clone(),
        crate::metrics::rejected_configs(&registry)?,
        &mut elections,
    )
    .await?;
    let writer = match &kube {
        Some(client) => crate::autoregistration::Writer::Kube(client.clone()),
        None => crate::autoregistration::Writer::memory(&sources.store),
    };
    let xds = xds.with_autoregistration(crate::autoregistration::Controller::start(
        config.autoregistration.clone(),
        sources.store.clone(),
        writer,
        shutdown_rx.clone(),
    ));
    let (inputs, jwks) = push_inputs(sources.batches, &sources.mesh, shutdown_rx.clone())?;
    let config_snapshots = sources.store.watch();
    let kube_slice = sources.store.slice(crate::source::kube::SLICE);
    let builder = crate::push::Builder::new(
        sources.store,
        RegistryOptions {
            domain: config.mesh.domain.clone(),
            trust_domain: config.mesh.trust_domain.clone(),
            cluster_id: config.mesh.cluster_id.clone(),
            features: config.features,
        },
        sources.mesh.clone(),
        jwks,
        cache,
    );
    let configz = sources.configz.clone();
    let mesh = sources.mesh.clone();
    // The root bundle every namespace gets, as `istio-ca-root-cert`,
    // following the CA's changes.
    if let Some(client) = &kube {
        // Only the holder of `istio-namespace-controller-election` writes;
        // each new holder starts over from a full list (a deleted ConfigMap
        // is put back).
        let (client, root_rx, mesh, synced) = (
            client.clone(),
            authority.subscribe(),
            sources.mesh.clone(),
            sources.mesh_synced.clone(),
        );
        tokio::spawn(crate::leaderelection::run_while_leader(
            "namespace controller",
            elections.namespace_controller(),
            shutdown_rx.clone(),
            move |stop| {
                crate::ca::namespace_controller::run(
                    client.clone(),
                    root_rx.clone(),
                    mesh.clone(),
                    synced.clone(),
                    stop,
                )
            },
        ));
    }
    tokio::spawn(crate::push::run(
        inputs,
        builder,
        sources.synced,
        ready_tx,
        push_tx,
        crate::push::Settings {
            after: config.push.debounce_after,
            max: config.push.debounce_max,
            metrics: push_metrics,
        },
    ));

    let mut secure_grpc_addr = None;
    if let Some(addr) = config.server.secure_grpc_addr {
        let listener = bind(addr, "the secure gRPC server (--secureGRPCAddr)").await?;
        secure_grpc_addr = Some(listener.local_addr()?);
        let tls = serving.grpc_config()?;
        let incoming =
            crate::grpc::tls_incoming(listener, tokio_rustls::TlsAcceptor::from(Arc::new(tls)));
        let ca = CaServer::new(
            authority.clone(),
            authenticators.clone(),
            ca_metrics.clone(),
        );
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(config.server.keepalive_interval))
            .http2_keepalive_timeout(Some(config.server.keepalive_timeout));
        if let Some(age) = config.server.max_connection_age {
            builder = builder
                .max_connection_age(age)
                .max_connection_age_grace(crate::xds::drain::MAX_CONNECTION_AGE_GRACE);
        }
        // Istio's `XDS_AUTH`: xDS callers on the TLS port are authenticated
        // as the CA's are, unless it is false (the CA always authenticates).
        let secure_xds = if config.ca.xds_auth {
            xds.with_authn(authenticators.clone())
        } else {
            xds.clone()
        };
        let router = builder
            .add_service(IstioCertificateServiceServer::new(ca))
            .add_service(secure_xds.into_service());
        let rx = shutdown_rx.clone();
        tasks.spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, shutdown_signal(rx))
                .await
                .context("secure gRPC server")
        });
        tracing::info!(
            "starting gRPC discovery service (xDS and CA) over TLS at {}",
            secure_grpc_addr.unwrap_or(addr)
        );
    }

    let mut grpc_addr = None;
    if let Some(addr) = config.server.grpc_addr {
        let listener = bind(addr, "the plaintext gRPC server (--grpcAddr)").await?;
        grpc_addr = Some(listener.local_addr()?);
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(config.server.keepalive_interval))
            .http2_keepalive_timeout(Some(config.server.keepalive_timeout));
        if let Some(age) = config.server.max_connection_age {
            builder = builder
                .max_connection_age(age)
                .max_connection_age_grace(crate::xds::drain::MAX_CONNECTION_AGE_GRACE);
        }
        let router = builder.add_service(xds.clone().into_service());
        let rx = shutdown_rx.clone();
        tasks.spawn(async move {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    shutdown_signal(rx),
                )
                .await
                .context("plaintext gRPC server")
        });
        tracing::info!(
            "starting gRPC discovery service (plaintext) at {}",
            grpc_addr.unwrap_or(addr)
        );
    }

    let app = crate::debug::router(crate::debug::DebugState {
        xds: xds.clone(),
        ready: ready_rx.clone(),
        configz,
    });
    xds.set_debug_mux(crate::debug::mux(app.clone()));
    let mut http_addr = None;
    if let Some(addr) = config.server.http_addr {
        let listener = bind(addr, "the HTTP server (--httpAddr)").await?;
        http_addr = Some(listener.local_addr()?);
        let rx = shutdown_rx.clone();
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown_signal(rx))
                .await
                .context("HTTP server")
        });
        tracing::info!("starting HTTP service at {}", http_addr.unwrap_or(addr));
    }

    let mut https_addr = None;
    if let Some(addr) = config.webhooks.https_addr {
        use crate::webhooks::{inject, patcher, server, validation};
        let listener = bind(addr, "the webhook server (--httpsAddr)").await?;
        https_addr = Some(listener.local_addr()?);
        let tls = serving.webhook_config()?;
        let listener =
            server::TlsListener::new(listener, tokio_rustls::TlsAcceptor::from(Arc::new(tls)))?;
        let inject_metrics = config
            .webhooks
            .inject_enabled
            .then(|| inject::InjectMetrics::new(&registry))
            .transpose()?;
        let injector = inject_metrics.map(|metrics| {
            let state = inject::start(
                &config.webhooks,
                &config.mesh.namespace,
                kube.clone(),
                mesh.clone(),
                shutdown_rx.clone(),
            );
            if let Some(client) = &kube {
                crate::source::kube::gateway_deployment::start(
                    client.clone(),
                    &kube_slice,
                    state.clone(),
                    gateway_deployment_settings(&config),
                    elections.gateway_deployment(),
                    shutdown_rx.clone(),
                );
            }
            Arc::new(inject::Injector::new(state, metrics).with_config(config_snapshots.clone()))
        });
        let validator = Arc::new(validation::Validator::new(
            &config.webhooks.revision,
            validation::ValidationMetrics::new(&registry)?,
        ));
        let app = server::router(injector, validator, ready_rx.clone());
        let rx = shutdown_rx.clone();
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown_signal(rx))
                .await
                .context("webhook server")
        });
        if let Some(client) = &kube {
            patcher::start(
                client.clone(),
                &config.webhooks.revision,
                authority.subscribe(),
                shutdown_rx.clone(),
            );
        }
        tracing::info!("starting webhook service at {}", https_addr.unwrap_or(addr));
    }

    let mut monitoring_addr = None;
    if let Some(addr) = config.server.monitoring_addr {
        let listener = bind(addr, "the monitoring server (--monitoringAddr)").await?;
        monitoring_addr = Some(listener.local_addr()?);
        let registry = Arc::new(registry);
        let app = Router::new()
            .route(
                "/metrics",
                get(move || {
                    let registry = registry.clone();
                    async move { metrics::render(&registry) }
                }),
            )
            .route("/version", get(|| async { crate::VERSION }));
        let rx = shutdown_rx.clone();
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown_signal(rx))
                .await
                .context("monitoring server")
        });
        tracing::info!(
            "starting monitoring service at {}",
            monitoring_addr.unwrap_or(addr)
        );
    }

    Ok(Bound {
        _authority: authority,
        secure_grpc_addr,
        http_addr,
        monitoring_addr,
        grpc_addr,
        https_addr,
        root_pem,
        shutdown,
        tasks,
        shutdown_duration: config.server.shutdown_duration,
        closing,
        elections: Some(elections),
    })
}

/// The automated gateway deployment's settings, from istiod's config and
/// `PILOT_ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS`.
fn gateway_deployment_settings(
    config: &crate::config::Config,
) -> crate::source::kube::gateway_deployment::Settings {
    use crate::source::kube::gateway_deployment::Settings;
    let copy_labels_annotations =
        Settings::copy_from_env(&common::env::ProcessEnv).unwrap_or_else(|e| {
            tracing::error!(target: "gateway", "{e}; using the default (true)");
            true
        });
    Settings {
        revision: config.webhooks.revision.clone(),
        cluster_id: config.mesh.cluster_id.clone(),
        domain: config.mesh.domain.clone(),
        system_namespace: config.mesh.namespace.clone(),
        copy_labels_annotations,
    }
}
