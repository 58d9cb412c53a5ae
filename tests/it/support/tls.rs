//! Throwaway certificate authorities for the TLS tests (rcgen, keys made at test time): a CA,
//! server certificates it signs written as PEM files into a temporary folder, and clients that
//! trust the CA — rustls configurations and a blocking connection that reports the certificate
//! the server presented.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use uuid::Uuid;

/// A certificate authority of one test, with the folder its files are written to (removed on
/// drop).
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    /// The folder of this CA's files.
    pub dir: PathBuf,
    /// The CA certificate as a PEM file (what clients trust).
    pub ca_file: PathBuf,
}

/// A server certificate and its key as PEM files.
pub struct ServerCert {
    /// The certificate file (just the server's certificate: the CA is what clients trust).
    pub cert_file: PathBuf,
    /// The private key file.
    pub key_file: PathBuf,
    /// The certificate, to compare with what a server presents.
    pub der: CertificateDer<'static>,
}

impl TestCa {
    /// A new CA named `name` (its common name) with a folder of its own.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("queen-test-tls-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("CA folder");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, cert.pem()).expect("CA file");
        Self {
            issuer: Issuer::new(params, key),
            cert: cert.der().clone(),
            dir,
            ca_file,
        }
    }

    /// A certificate for `names` (host names or IP addresses), signed by this CA, with a new
    /// key; written as `{stem}.crt` and `{stem}.key` in the CA's folder.
    pub fn issue(&self, stem: &str, names: &[&str]) -> ServerCert {
        self.issue_into(&self.dir, stem, names)
    }

    /// As [`TestCa::issue`], into `dir`.
    pub fn issue_into(&self, dir: &Path, stem: &str, names: &[&str]) -> ServerCert {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("queen test {stem}"));
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        let cert_file = dir.join(format!("{stem}.crt"));
        let key_file = dir.join(format!("{stem}.key"));
        std::fs::write(&cert_file, cert.pem()).expect("certificate file");
        std::fs::write(&key_file, key.serialize_pem()).expect("key file");
        ServerCert {
            cert_file,
            key_file,
            der: cert.der().clone(),
        }
    }

    /// A rustls client configuration that trusts this CA only.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.cert.clone())
            .expect("CA certificate is a root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A blocking HTTPS connection to 127.0.0.1:`port` (for the tests that look at the certificate
/// a handshake got, or keep one connection across a reload). Call it off the test's runtime
/// (`spawn_blocking`).
pub struct Https {
    stream: StreamOwned<ClientConnection, TcpStream>,
    port: u16,
}

impl Https {
    /// Connects and completes the handshake.
    ///
    /// # Errors
    ///
    /// What the connection or the handshake failed with (an untrusted certificate, say).
    pub fn connect(config: Arc<ClientConfig>, port: u16) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(("127.0.0.1", port))?;
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        let name = ServerName::try_from("127.0.0.1").expect("an IP address is a server name");
        let conn = ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        let mut stream = StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(Self { stream, port })
    }

    /// The certificate the server presented (its first).
    pub fn server_cert(&self) -> CertificateDer<'static> {
        self.stream
            .conn
            .peer_certificates()
            .and_then(|chain| chain.first())
            .expect("the server presented a certificate")
            .clone()
            .into_owned()
    }

    /// GETs `path` on this connection (kept alive) and returns the status line and body.
    pub fn get(&mut self, path: &str) -> std::io::Result<(String, String)> {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: keep-alive\r\n\r\n",
            self.port
        );
        self.stream.write_all(request.as_bytes())?;
        self.stream.flush()?;
        // Read the head, then exactly content-length bytes (the connection stays open).
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            self.stream.read_exact(&mut byte)?;
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())
                    .flatten()
            })
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body)?;
        let status = head.lines().next().unwrap_or_default().to_string();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// Sends `request` as it is, then hangs up politely: a TLS close_notify alert before the
    /// end of the TCP stream (what a well-behaved TLS client does).
    pub fn send_and_close(mut self, request: &str) -> std::io::Result<()> {
        self.stream.write_all(request.as_bytes())?;
        self.stream.flush()?;
        self.stream.conn.send_close_notify();
        self.stream.conn.complete_io(&mut self.stream.sock)?;
        self.stream.sock.shutdown(std::net::Shutdown::Write)?;
        Ok(())
    }
}
