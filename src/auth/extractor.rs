//! [`Caller`] as a handler argument: the caller the gate verified for this request, or an
//! anonymous one (no `sub`, no roles) when auth is off or the path needs no token. Never reads
//! the body or the headers itself: only the gate puts a caller into a request.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};

use crate::auth::Caller;

impl FromRequest for Caller {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Ok(req
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default()))
    }
}

impl Caller {
    /// The `producerSub` to stamp on what this caller pushes.
    pub fn producer_sub(&self) -> Option<&str> {
        self.sub.as_deref()
    }
}
