//! A loopback TCP proxy the test can freeze, as `kill -STOP` would freeze a real one: while
//! frozen it neither reads nor writes, so requests sit in socket buffers and are delivered
//! when it thaws — including requests whose sender gave up meanwhile. That is the network
//! partition a leader election must survive.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy to one upstream address.
pub struct FreezableProxy {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl FreezableProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let (frozen, _) = watch::channel(false);
        let gate = frozen.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, gate.clone()), pump(sr, cw, gate));
                });
            }
        });
        Ok(Self {
            addr,
            frozen,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops moving bytes in either direction (connections stay open).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Moves bytes again, delivering whatever waited.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// A copy of `kubeconfig` whose server is this proxy, written to `dir`.
    pub fn kubeconfig(&self, kubeconfig: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
        let text = std::fs::read_to_string(kubeconfig)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        let server = api_server(&text)?;
        let rewritten = text.replace(
            &format!("https://{server}"),
            &format!("https://{}", self.addr),
        );
        let path = dir.join(format!("kubeconfig-proxy-{}", self.addr.port()));
        std::fs::write(&path, rewritten).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.thaw();
        self.accept.abort();
    }
}

/// The `host:port` of the API server a kubeconfig names.
pub fn api_server(kubeconfig: &str) -> anyhow::Result<SocketAddr> {
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .context("no https server in the kubeconfig")?;
    server
        .trim()
        .trim_end_matches('/')
        .parse()
        .with_context(|| format!("API server address {server:?}"))
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Bytes read just before a freeze are held until the thaw, like a stopped process.
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
