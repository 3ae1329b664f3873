//! Minimal HTTP/1.1 over keep-alive connections for the benches that drive real Envoys: a local
//! upstream answering `200 ok`, and one sequential `GET` at a time. Deliberately small: the
//! figures measure Envoy, so the bench's own side must cost next to nothing and hide nothing.

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Serves every request of every connection with `200 ok` until the listener fails.
pub async fn upstream(listener: TcpListener) {
    while let Ok((mut conn, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(4096);
            let mut chunk = [0u8; 4096];
            loop {
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                while let Some(end) = find(&buf, b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if conn.write_all(reply).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads more of the connection into `buf`; an error at end of stream.
async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Result<()> {
    let mut chunk = [0u8; 4096];
    let n = conn.read(&mut chunk).await?;
    if n == 0 {
        bail!("connection closed");
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// One `GET path` on a keep-alive connection (`buf` carries bytes read past the previous
/// answer); returns the status and the body (`content-length` or chunked framing, as Envoy's
/// admin answers).
pub async fn get(conn: &mut TcpStream, buf: &mut Vec<u8>, path: &str) -> Result<(u16, Vec<u8>)> {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: web.shop\r\n\r\n").as_bytes())
        .await?;
    let end = loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            break end;
        }
        fill(conn, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    buf.drain(..end + 4);
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(e) = find(buf, b"\r\n") {
                    break e;
                }
                fill(conn, buf).await?;
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .with_context(|| format!("chunk size {size_text:?}"))?;
            while buf.len() < line_end + 2 + size + 2 {
                fill(conn, buf).await?;
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                return Ok((status, body));
            }
        }
    }
    let len: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < len {
        fill(conn, buf).await?;
    }
    let body = buf[..len].to_vec();
    buf.drain(..len);
    Ok((status, body))
}
