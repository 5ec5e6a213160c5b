//! Who is calling: API keys and the tenants they map to, each tenant's
//! concurrent-stream slots, and the key that seals opaque blobs.

pub mod auth;
pub mod seal;
pub mod slots;
