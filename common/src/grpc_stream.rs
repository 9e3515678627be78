//! One gRPC stream driven in process from raw bytes, as the fuzz targets
//! and their corpus regression tests feed istiod's ADS and the agent's SDS:
//! the request body exactly as it would come off the wire (5-byte message
//! frames), the response body read to its end.

use std::time::Duration;

use http_body_util::BodyExt;
use tonic::body::Body;

/// Why a driven stream did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// The service failed the call itself.
    #[error("the service failed: {0}")]
    Service(String),
    /// The response body failed.
    #[error("the response body failed: {0}")]
    Body(String),
    /// The response did not end within the limit after the requests ended:
    /// the stream hangs.
    #[error("the response did not end within {0:?} of the request body's end")]
    Hung(Duration),
}

/// The gRPC wire framing of `messages`: each an uncompressed flag byte, a
/// big-endian length and the message.
pub fn frames<'a>(messages: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        out.push(0);
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// `data` cut into chunks each preceded by a big-endian `u16` length (the
/// fuzz targets' way of carrying a sequence of messages); a last chunk
/// shorter than its length is taken as it is.
pub fn chunks(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let len = u16::from_be_bytes([data[0], data[1]]) as usize;
        let rest = &data[2..];
        let (chunk, tail) = rest.split_at(len.min(rest.len()));
        out.push(chunk);
        data = tail;
    }
    out
}

/// Calls `service` at `path` with `body` as the whole request stream and
/// reads the response body to its end: the response frames' bytes and the
/// trailers' `grpc-status`, if any.
pub async fn drive<S>(
    service: &mut S,
    path: &str,
    body: Vec<u8>,
    limit: Duration,
) -> Result<(Vec<u8>, Option<String>), DriveError>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Error: std::fmt::Debug,
{
    use tower::ServiceExt;
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://fuzz{path}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(Body::new(http_body_util::Full::new(bytes::Bytes::from(
            body,
        ))))
        .map_err(|e| DriveError::Service(e.to_string()))?;
    let service = service
        .ready()
        .await
        .map_err(|e| DriveError::Service(format!("{e:?}")))?;
    let response = service
        .call(request)
        .await
        .map_err(|e| DriveError::Service(format!("{e:?}")))?;
    let status = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let collected = tokio::time::timeout(limit, response.into_body().collect())
        .await
        .map_err(|_| DriveError::Hung(limit))?
        .map_err(|e| DriveError::Body(e.to_string()))?;
    let status = status.or_else(|| {
        collected
            .trailers()
            .and_then(|t| t.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    Ok((collected.to_bytes().to_vec(), status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_take_their_length_and_the_last_takes_what_is_left() {
        let data = [0, 2, b'a', b'b', 0, 9, b'c'];
        assert_eq!(chunks(&data), vec![&b"ab"[..], &b"c"[..]]);
        assert!(chunks(&[7]).is_empty());
    }

    #[test]
    fn frames_prefix_flag_and_length() {
        assert_eq!(frames([&b"xy"[..]]), vec![0, 0, 0, 0, 2, b'x', b'y']);
    }
}
