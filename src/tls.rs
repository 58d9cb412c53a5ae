//! TLS of the HTTP listener: reads the PEM certificate chain and private key that
//! `QUEEN_TLS_CERT_FILE` and `QUEEN_TLS_KEY_FILE` name, checks that they belong together, and
//! hands them to every handshake through [`CertStore`], a rustls certificate resolver.
//!
//! [`CertStore::reload`] reads both files again; [`reload_on_hangup`] calls it on each SIGHUP.
//! A handshake after a reload gets the new certificate; a connection already open keeps the one
//! it began with (nothing is dropped); a reload that fails is logged and changes nothing, the
//! previous certificate stays in use. The crypto is rustls with *ring*, the provider already
//! used for the JWKS fetch.
//!
//! It never reads settings nor decides whether TLS is on (`app` does both, passing the two
//! paths), and it imports nothing of the crate.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// Why a certificate or key file could not be used; every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read (missing, unreadable).
    #[error("cannot read the {what} file {path}: {source}")]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not well-formed PEM.
    #[error("the {what} file {path} is not valid PEM: {reason}")]
    Pem {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        reason: String,
    },
    /// The certificate file holds no certificate.
    #[error(
        "the certificate file {path} holds no certificate (expected a PEM \
         \"-----BEGIN CERTIFICATE-----\" block)"
    )]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no (unencrypted) private key.
    #[error(
        "the key file {path} holds no private key (expected a PEM \"PRIVATE KEY\", \
         \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block; an encrypted key cannot be used)"
    )]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The key is of a kind rustls cannot sign with.
    #[error("the key file {path} holds a key that cannot be used: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// The first certificate does not parse as X.509.
    #[error("the first certificate in {path} cannot be used: {reason}")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// The key is not the key of the first certificate.
    #[error(
        "the key in {key} does not belong to the first certificate in {cert} (their public \
         keys differ)"
    )]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
}

/// The crypto of the listener: rustls's *ring* provider.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn bad_pem(what: &'static str, path: &Path, e: &pem::Error) -> TlsError {
    TlsError::Pem {
        what,
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Reads the chain and key and checks that the key is the first certificate's.
///
/// # Errors
///
/// [`TlsError`] naming the file that is missing, unreadable, not PEM, holds nothing usable, or
/// (for the key) belongs to another certificate.
pub fn load(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let cert_pem = read("certificate", cert_file)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem("certificate", cert_file, &e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_file.to_path_buf(),
        });
    }
    let key_pem = read("key", key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey {
            path: key_file.to_path_buf(),
        },
        other => bad_pem("key", key_file, &other),
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key {
            path: key_file.to_path_buf(),
            reason: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::Mismatch {
                cert: cert_file.to_path_buf(),
                key: key_file.to_path_buf(),
            })
        }
        // The ring keys all know their public key, so this is not expected; nothing to compare.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
        Err(e) => Err(TlsError::Certificate {
            path: cert_file.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// The listener's certificate and key, swapped whole on a reload. Handshakes read it (a
/// clone of an `Arc` under a read lock); a reload takes the write lock only to swap.
pub struct CertStore {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl CertStore {
    /// Reads the two files; the store serves them until the next successful reload.
    ///
    /// # Errors
    ///
    /// [`TlsError`] as [`load`].
    pub fn open(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, TlsError> {
        let provider = provider();
        let loaded = load(cert_file, key_file, &provider)?;
        Ok(Arc::new(Self {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(loaded)),
        }))
    }

    /// Reads both files again and serves them from the next handshake on; on an error the
    /// certificate served so far stays.
    ///
    /// # Errors
    ///
    /// [`TlsError`] as [`load`].
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = Arc::new(load(&self.cert_file, &self.key_file, &self.provider)?);
        // A panic never happens while the lock is held, so a poisoned lock still holds a
        // whole certificate.
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = loaded;
        Ok(())
    }

    /// The certificate chain and key served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The certificate file.
    pub fn cert_file(&self) -> &Path {
        &self.cert_file
    }

    /// The key file.
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    /// The rustls configuration of the listener: TLS 1.2 and 1.3 (rustls's safe defaults),
    /// no client certificates, the certificate from this store at each handshake. actix-web
    /// adds the ALPN protocol (`http/1.1`).
    pub fn server_config(self: &Arc<Self>) -> ServerConfig {
        ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(self.clone())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Reloads `store` at every SIGHUP and logs the outcome. The handler is installed before this
/// returns, so a SIGHUP from then on reloads (and never ends the process, SIGHUP's default);
/// spawn the returned future on the runtime.
///
/// # Errors
///
/// When the signal handler cannot be installed.
pub fn reload_on_hangup(store: Arc<CertStore>) -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            let reloading = store.clone();
            // The files may sit on a slow disk: read them off the HTTP threads.
            match tokio::task::spawn_blocking(move || reloading.reload()).await {
                Ok(Ok(())) => tracing::info!(
                    cert_file = %store.cert_file.display(),
                    key_file = %store.key_file.display(),
                    "TLS certificate reloaded (SIGHUP): new connections get it"
                ),
                Ok(Err(e)) => tracing::error!(
                    error = %e,
                    "TLS certificate not reloaded (SIGHUP); the previous one stays in use"
                ),
                Err(e) => tracing::error!(
                    error = %e,
                    "TLS certificate reload did not finish; the previous one stays in use"
                ),
            }
        }
    })
}
