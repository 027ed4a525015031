//! A library built without the `models` feature: `hs_requests_open` is refused, so no
//! `hs_requests` handle exists and the other calls never reach an object.

use super::{hs_request_options, hs_requests, hs_requests_limits};
use crate::error::CapiError;
use crate::handles::HandleKind;

/// No request engine: a type without values.
pub(crate) enum RequestsObject {}

impl HandleKind for RequestsObject {
    const KIND: &'static str = "requests";
    type C = hs_requests;
}

impl RequestsObject {
    pub(super) fn open(_path: &str, _limits: hs_requests_limits) -> Result<Self, CapiError> {
        Err(CapiError::State(
            "this library was built without the `models` feature: it schedules only, and has no request engine".into(),
        ))
    }

    pub(super) fn submit(
        &self,
        _: &str,
        _: hs_request_options,
        _: usize,
        _: Vec<String>,
    ) -> Result<u64, CapiError> {
        match *self {}
    }

    pub(super) fn cancel(&self, _: u64) -> Result<(), CapiError> {
        match *self {}
    }

    pub(super) fn metrics_json(&self) -> Result<String, CapiError> {
        match *self {}
    }

    pub(super) fn on_event_thread(&self) -> bool {
        match *self {}
    }

    pub(super) fn close(&self) -> Result<(), CapiError> {
        match *self {}
    }
}
