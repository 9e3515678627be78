//! What a VirtualService's HTTP routes may name that both validation and
//! the route generator read: gRPC status names (`fault.abort.grpcStatus`)
//! and Istio's ceiling on `directResponse` bodies.

/// Istio's ceiling on direct responses (1 MiB).
pub const MAX_DIRECT_RESPONSE_BODY_BYTES: u32 = 1024 * 1024;

/// The code of a gRPC status by Istio's name (`fault.abort.grpcStatus`),
/// e.g. `UNAVAILABLE` is 14.
pub fn grpc_code(name: &str) -> Option<u32> {
    const CODES: &[&str] = &[
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    CODES.iter().position(|c| *c == name).map(|i| i as u32)
}
