//! Connections and their time limits: the accept loop of `mollm serve`, each connection on
//! hyper's HTTP/1 with a header-read timeout (which also closes idle keep-alive connections),
//! a deadline on request bodies, a deadline on response writes that make no progress, a bound
//! on open connections, and a shutdown that drops whatever is left at a hard deadline.

use super::error::ApiError;
use super::App;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The time limits of a connection (`--header-timeout`, `--io-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request's headers must arrive within this of the connection opening or of the
    /// previous answer: a keep-alive connection idle this long is closed.
    pub header: Duration,
    /// A request body must arrive within this; a response write that makes no progress for
    /// this long ends the connection.
    pub io: Duration,
    /// Open connections at most; one more is answered 503 and closed.
    pub max_connections: usize,
}

/// The open connections: each is told to close gracefully through `close`, and the set is
/// aborted at the hard deadline.
pub struct Conns {
    set: JoinSet<()>,
    close: watch::Sender<bool>,
    http: hyper::server::conn::http1::Builder,
    limits: Limits,
}

impl Conns {
    pub fn new(limits: Limits) -> Conns {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header);
        Conns {
            set: JoinSet::new(),
            close: watch::channel(false).0,
            http,
            limits,
        }
    }

    /// Serves `stream` with `router` until it closes, is told to close, or fails a limit.
    pub fn serve(&mut self, stream: TcpStream, router: axum::Router) {
        while self.set.try_join_next().is_some() {}
        if self.set.len() >= self.limits.max_connections {
            let max = self.limits.max_connections;
            // Outside the set: it ends by itself within a second.
            tokio::spawn(refuse(stream, max));
            return;
        }
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Stalls::new(stream, self.limits.io));
        let svc = hyper_util::service::TowerToHyperService::new(router);
        let conn = self.http.serve_connection(io, svc);
        let mut close = self.close.subscribe();
        self.set.spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = close.wait_for(|c| *c) => {}
            }
            // Idle keep-alive connections close now; one mid-answer closes after it.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }

    /// Tells every connection to close after its current answer, waits for them until
    /// `deadline`, then drops the rest.
    pub async fn close(mut self, deadline: tokio::time::Instant) {
        let _ = self.close.send(true);
        let all = async { while self.set.join_next().await.is_some() {} };
        if tokio::time::timeout_at(deadline, all).await.is_err() {
            self.set.abort_all();
            while self.set.join_next().await.is_some() {}
        }
    }
}

/// The answer to a connection over `--max-connections`: a whole 503 response, written within a
/// second or not at all.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = ApiError::too_many_connections(max).body().to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// Accepts connections until `stop` resolves (accept errors such as running out of file
/// descriptors are reported once a second and retried, not fatal).
pub async fn accept_until(
    listener: &TcpListener,
    conns: &mut Conns,
    router: &axum::Router,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut last_report = None::<tokio::time::Instant>;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => conns.serve(stream, router.clone()),
                Err(e) => {
                    let now = tokio::time::Instant::now();
                    if last_report.is_none_or(|t| now - t >= Duration::from_secs(1)) {
                        eprintln!("mollm serve: cannot accept a connection: {e}");
                        last_report = Some(now);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Reads the whole request body within `--io-timeout` (408 past it) and at most `--max-body`
/// bytes (413), before any route sees it: a client that trickles its body holds no more than
/// a connection for that long.
pub async fn body_deadline(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let limit = app.max_body;
    let read = axum::body::to_bytes(body, limit);
    let bytes = match tokio::time::timeout(app.limits.io, read).await {
        Err(_) => {
            let mut r = ApiError::request_timeout(app.limits.io).into_response();
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            return r;
        }
        Ok(Err(e)) => {
            // The only error `to_bytes` makes itself is the length limit; the others come
            // from the connection.
            let too_long = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return if too_long {
                ApiError::payload_too_large(limit).into_response()
            } else {
                ApiError::bad_request(format!("could not read the body: {e}")).into_response()
            };
        }
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A socket whose writes fail once they have made no progress for `limit` (a client that
/// stops reading its answer), so that such a connection ends instead of holding its task.
struct Stalls {
    inner: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stalls {
    fn new(inner: TcpStream, limit: Duration) -> Stalls {
        Stalls {
            inner,
            limit,
            stalled: None,
        }
    }

    /// On a pending write: arms the stall timer, and fails once it has run out.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", limit.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.pending(cx),
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl AsyncRead for Stalls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stalls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
