//! The HTTP listener: HTTP/1.1 connections (hyper) with bounded time and
//! number, so that slow, idle or too many clients cannot hold the server.
//!
//! - A connection has `--http-timeout` to send each request's headers,
//!   which also bounds how long an idle keep-alive connection stays open,
//!   and as long again for the body (a body that declares a terabyte and
//!   sends ten bytes gets 408), see [`read_body`].
//! - At most `max_connections` are open; the next ones get a 503 in
//!   OpenAI's error shape and are closed.
//! - The process's descriptor limit is raised to its hard limit at start
//!   ([`raise_descriptor_limit`]).
//! - On shutdown, listening stops and open connections finish their
//!   requests (streams included) before `serve` returns.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::openai::ApiError;

/// Longest request target (path and query); longer gets 414.
const MAX_URI_BYTES: usize = 8 * 1024;

/// Most bytes of request headers; more gets 431.
const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Hyper's read buffer: a request head beyond it is refused by hyper itself
/// (a bare 431); below it, [`read_body`] answers in OpenAI's shape.
const HYPER_BUFFER_BYTES: usize = 256 * 1024;

/// Raises the soft limit on open descriptors to the hard limit and returns
/// the limit in force.
pub fn raise_descriptor_limit() -> u64 {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain system calls on a local struct.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return 1024;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        limit.rlim_cur
    }
    #[cfg(not(unix))]
    {
        u64::MAX
    }
}

/// Checks a request's head and reads its body within `timeout` (and
/// `max_body_bytes`), so that handlers only ever see complete requests.
pub async fn read_body(
    (max_body_bytes, timeout): (usize, Duration),
    request: Request,
    next: Next,
) -> Response {
    let uri = request.uri().to_string().len();
    if uri > MAX_URI_BYTES {
        return ApiError::status(
            414,
            format!("the request target is {uri} bytes, at most {MAX_URI_BYTES}"),
        )
        .into_response();
    }
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers > MAX_HEADER_BYTES {
        return ApiError::status(
            431,
            format!("the request headers are {headers} bytes, at most {MAX_HEADER_BYTES}"),
        )
        .into_response();
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(timeout, to_bytes(body, max_body_bytes)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return ApiError::status(
                413,
                format!("the request body is larger than {max_body_bytes} bytes, or broken"),
            )
            .into_response()
        }
        Err(_) => {
            return ApiError::status(
                408,
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs_f32()
                ),
            )
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The answer to a connection beyond the limit, written before closing it.
fn refusal() -> Vec<u8> {
    let body = ApiError::status(
        503,
        "the server has too many open connections; retry later".to_owned(),
    )
    .body()
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open
/// connections finish. Headers must arrive within `header_timeout`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    (max_connections, header_timeout): (usize, Duration),
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(HYPER_BUFFER_BYTES);
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors or a connection reset before accept:
                // wait a moment rather than spin, and go on.
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&refusal()))
                    .await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that breaks its connection is no error of ours.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
