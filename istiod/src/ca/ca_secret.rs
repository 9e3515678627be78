//! Istio's `istio-ca-secret`: where the self-signed CA lives on Kubernetes
//! (istiod's namespace, type `istio.io/ca-root`, keys `ca-cert.pem`,
//! `ca-key.pem`, `cert-chain.pem`, `key.pem`, `root-cert.pem`), so that every
//! replica and every restart signs under the same root. The first istiod
//! creates it; one that loses the create (409 AlreadyExists) reads the
//! winner's.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use common::pki::{self, KeyType};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};

use super::material::{
    self, CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, CaBundle, MaterialError, ROOT_CERT_FILE,
    SelfSignedOptions,
};

/// The Secret holding the self-signed CA.
pub const CA_SECRET: &str = "istio-ca-secret";
/// Its type, as Istio writes it.
pub const CA_SECRET_TYPE: &str = "istio.io/ca-root";
/// The (empty) workload key Istio's Secret layout carries.
pub const PRIVATE_KEY_FILE: &str = "key.pem";

/// How many times a lost create is followed by a read before giving up.
const MAX_CREATE_RACES: usize = 5;

/// Why the Secret could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CaSecretError {
    /// The API refused or could not be reached.
    #[error("Secret {secret}: {source}")]
    Api {
        /// `namespace/name`.
        secret: String,
        /// The API error.
        source: kube::Error,
    },
    /// The Secret's content is not a usable CA.
    #[error(transparent)]
    Material(#[from] MaterialError),
    /// The create kept losing to a Secret that then could not be read.
    #[error(
        "Secret {0}: the create was refused as existing {MAX_CREATE_RACES} times but the Secret cannot be read"
    )]
    Race(String),
}

/// A Secret's data and version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// The data.
    pub data: BTreeMap<String, Vec<u8>>,
    /// `metadata.resourceVersion`, for optimistic updates.
    pub resource_version: Option<String>,
}

/// What a write met.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// 409: the Secret exists (create) or changed since read (update).
    #[error("conflict")]
    Conflict,
    /// Any other failure.
    #[error(transparent)]
    Api(kube::Error),
}

/// The few Secret operations the CA needs, in one namespace.
pub trait SecretStore: Send + Sync {
    /// Reads `name`; `None` if absent.
    fn get(&self, name: &str) -> impl Future<Output = Result<Option<Stored>, kube::Error>> + Send;
    /// Creates `name` with `data`.
    fn create(
        &self,
        name: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// Replaces `name`'s data if it is still at `stored.resource_version`.
    fn update(
        &self,
        name: &str,
        stored: &Stored,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// The Kubernetes API as a [`SecretStore`].
#[derive(Clone)]
pub struct KubeSecrets {
    api: kube::Api<Secret>,
    namespace: String,
}

impl KubeSecrets {
    /// Secrets of `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    /// `namespace/name`, for messages.
    pub fn qualified(&self, name: &str) -> String {
        format!("{}/{name}", self.namespace)
    }

    fn secret(&self, name: &str, data: &BTreeMap<String, Vec<u8>>, rv: Option<String>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                resource_version: rv,
                ..Default::default()
            },
            type_: Some(CA_SECRET_TYPE.to_string()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                    .collect(),
            ),
            ..Default::default()
        }
    }
}

fn write_error(e: kube::Error) -> WriteError {
    match e {
        kube::Error::Api(s) if s.code == 409 => WriteError::Conflict,
        e => WriteError::Api(e),
    }
}

impl SecretStore for KubeSecrets {
    async fn get(&self, name: &str) -> Result<Option<Stored>, kube::Error> {
        Ok(self.api.get_opt(name).await?.map(|s| Stored {
            data: s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
            resource_version: s.metadata.resource_version,
        }))
    }

    async fn create(&self, name: &str, data: &BTreeMap<String, Vec<u8>>) -> Result<(), WriteError> {
        self.api
            .create(&PostParams::default(), &self.secret(name, data, None))
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    async fn update(&self, name: &str, stored: &Stored) -> Result<(), WriteError> {
        let secret = self.secret(name, &stored.data, stored.resource_version.clone());
        self.api
            .replace(name, &PostParams::default(), &secret)
            .await
            .map(|_| ())
            .map_err(write_error)
    }
}

/// The data Istio writes for a self-signed CA: the root is both `ca-cert.pem`
/// and `root-cert.pem` (after a rotation `root-cert.pem` also lists the
/// previous root); the workload keys are empty.
pub fn secret_data(ca_cert: &str, ca_key: &str, root_certs: &str) -> BTreeMap<String, Vec<u8>> {
    [
        (CA_CERT_FILE, ca_cert),
        (CA_KEY_FILE, ca_key),
        (CERT_CHAIN_FILE, ""),
        (PRIVATE_KEY_FILE, ""),
        (ROOT_CERT_FILE, root_certs),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
    .collect()
}

/// Reads the self-signed CA from `istio-ca-secret`, or makes a root and
/// creates the Secret; a create that loses the race reads the winner's.
/// Transient API failures are retried (logged) until the API answers.
pub async fn load_or_create<S: SecretStore>(
    store: &S,
    qualified: &str,
    opts: &SelfSignedOptions,
) -> Result<CaBundle, CaSecretError> {
    let mut delay = Duration::from_millis(500);
    let mut races = 0;
    loop {
        let existing = match store.get(CA_SECRET).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(target: "ca", "cannot read Secret {qualified}: {e}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        if let Some(stored) = existing {
            let bundle = material::load_ca_secret(qualified, &stored.data)?;
            tracing::info!(target: "ca", "loaded the signing key and root from the existing Secret {qualified}");
            return Ok(bundle);
        }
        if races >= MAX_CREATE_RACES {
            return Err(CaSecretError::Race(qualified.to_string()));
        }
        tracing::info!(target: "ca", "Secret {qualified} not found; creating a self-signed root");
        let opts2 = opts.clone();
        let (cert, key) = tokio::task::spawn_blocking(move || -> Result<_, MaterialError> {
            let key = pki::generate_key(KeyType::Rsa(opts2.rsa_key_size))?;
            Ok((
                material::self_signed_root(&key, &opts2)?,
                key.serialize_pem(),
            ))
        })
        .await
        .map_err(|e| MaterialError::Mismatch {
            path: qualified.to_string(),
            reason: format!("key generation failed: {e}"),
        })??;
        match store
            .create(CA_SECRET, &secret_data(&cert, &key, &cert))
            .await
        {
            Ok(()) => {
                tracing::info!(target: "ca", "created Secret {qualified} with a new self-signed root");
                return Ok(material::load_ca_secret(
                    qualified,
                    &secret_data(&cert, &key, &cert),
                )?);
            }
            Err(WriteError::Conflict) => {
                races += 1;
                tracing::info!(target: "ca", "Secret {qualified} was created by another istiod; using its root");
            }
            // Istio retries with backoff too (e.g. the namespace is not there yet).
            Err(WriteError::Api(e)) => {
                tracing::warn!(target: "ca", "cannot create Secret {qualified}: {e}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An in-memory Secret store; `on_create` runs before each create (to
    /// let "another istiod" win the race).
    #[derive(Default)]
    pub(crate) struct MemorySecrets {
        pub secrets: Mutex<BTreeMap<String, Stored>>,
        pub creates: Mutex<usize>,
        pub winner: Mutex<Option<BTreeMap<String, Vec<u8>>>>,
    }

    impl SecretStore for MemorySecrets {
        async fn get(&self, name: &str) -> Result<Option<Stored>, kube::Error> {
            Ok(self.secrets.lock().unwrap().get(name).cloned())
        }
        async fn create(
            &self,
            name: &str,
            data: &BTreeMap<String, Vec<u8>>,
        ) -> Result<(), WriteError> {
            *self.creates.lock().unwrap() += 1;
            let mut secrets = self.secrets.lock().unwrap();
            if let Some(winner) = self.winner.lock().unwrap().take() {
                secrets.insert(
                    name.into(),
                    Stored {
                        data: winner,
                        resource_version: Some("1".into()),
                    },
                );
            }
            if secrets.contains_key(name) {
                return Err(WriteError::Conflict);
            }
            secrets.insert(
                name.into(),
                Stored {
                    data: data.clone(),
                    resource_version: Some("1".into()),
                },
            );
            Ok(())
        }
        async fn update(&self, name: &str, stored: &Stored) -> Result<(), WriteError> {
            let mut secrets = self.secrets.lock().unwrap();
            let current = secrets.get_mut(name).ok_or(WriteError::Conflict)?;
            if current.resource_version != stored.resource_version {
                return Err(WriteError::Conflict);
            }
            let next = current
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            *current = Stored {
                data: stored.data.clone(),
                resource_version: Some(next.to_string()),
            };
            Ok(())
        }
    }

    pub(crate) fn opts(ttl: Duration) -> SelfSignedOptions {
        SelfSignedOptions {
            trust_domain: "cluster.local".into(),
            ttl,
            rsa_key_size: 2048,
        }
    }

    pub(crate) fn root_data(ttl: Duration) -> BTreeMap<String, Vec<u8>> {
        let key = pki::generate_key(KeyType::Rsa(2048)).unwrap();
        let cert = material::self_signed_root(&key, &opts(ttl)).unwrap();
        secret_data(&cert, &key.serialize_pem(), &cert)
    }

    const YEAR: Duration = Duration::from_secs(365 * 86400);

    #[tokio::test]
    async fn the_first_istiod_creates_the_secret_with_istio_keys_and_a_restart_reads_it() {
        let store = MemorySecrets::default();
        let first = load_or_create(&store, "istio-system/istio-ca-secret", &opts(YEAR))
            .await
            .unwrap();
        let stored = store.secrets.lock().unwrap()[CA_SECRET].clone();
        let keys: Vec<&str> = stored.data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "ca-cert.pem",
                "ca-key.pem",
                "cert-chain.pem",
                "key.pem",
                "root-cert.pem"
            ]
        );
        assert_eq!(stored.data["ca-cert.pem"], stored.data["root-cert.pem"]);
        let again = load_or_create(&store, "istio-system/istio-ca-secret", &opts(YEAR))
            .await
            .unwrap();
        assert_eq!(first.root_pem, again.root_pem);
        assert_eq!(
            *store.creates.lock().unwrap(),
            1,
            "a restart does not create"
        );
    }

    #[tokio::test]
    async fn the_istiod_that_loses_the_create_uses_the_winners_root() {
        let store = MemorySecrets::default();
        let winner = root_data(YEAR);
        *store.winner.lock().unwrap() = Some(winner.clone());
        let bundle = load_or_create(&store, "istio-system/istio-ca-secret", &opts(YEAR))
            .await
            .unwrap();
        assert_eq!(
            bundle.root_pem.as_bytes(),
            winner["root-cert.pem"].as_slice()
        );
        assert_eq!(store.secrets.lock().unwrap()[CA_SECRET].data, winner);
    }

    #[tokio::test]
    async fn a_secret_without_a_key_is_refused_by_name() {
        let store = MemorySecrets::default();
        let mut data = root_data(YEAR);
        data.remove("ca-key.pem");
        store.secrets.lock().unwrap().insert(
            CA_SECRET.into(),
            Stored {
                data,
                resource_version: None,
            },
        );
        let err = load_or_create(&store, "istio-system/istio-ca-secret", &opts(YEAR))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "Secret istio-system/istio-ca-secret is incomplete: key ca-key.pem is missing"
            ),
            "{err}"
        );
    }
}
