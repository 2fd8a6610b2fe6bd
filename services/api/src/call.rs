//! What a mutation of one record reads from its request before its body:
//! the API, the caller (set by the scope check) and the record's id (the
//! path's `{id}`), extracted in that order with the rejections of
//! `Extension` and [`P`].

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::auth::Caller;
use crate::error::P;
use crate::App;

/// A caller's request on the record its path names.
pub struct Call {
    pub app: App,
    pub caller: Caller,
    pub id: String,
}

impl FromRequestParts<App> for Call {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Call, Response> {
        let Extension(caller) = Extension::<Caller>::from_request_parts(parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        let P(id) = P::<String>::from_request_parts(parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Call {
            app: app.clone(),
            caller,
            id,
        })
    }
}
