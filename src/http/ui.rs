//! The web dashboard at `/ui`: a page, a style sheet and native ES modules,
//! all compiled into the binary (no build step).
//!
//! The page holds no data and needs no token to load; the script asks for a
//! token and sends it with every API call, so the dashboard can do exactly
//! what its token's role allows and nothing more. Nothing is fetched from
//! another origin, and the Content-Security-Policy says so to the browser.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::AppState;

const INDEX_HTML: &str = include_str!("../../ui/index.html");

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
/// Browsers run a module only when it is served with a JavaScript type.
const JS: &str = "text/javascript; charset=utf-8";

/// Every file under `ui/` but the page: its URL, type and contents. A file
/// missing here is a 404 in the browser; a test compares this with `ui/`.
const ASSETS: &[(&str, &str, &str)] = &[
    ("/ui/style.css", CSS, include_str!("../../ui/style.css")),
    ("/ui/js/main.js", JS, include_str!("../../ui/js/main.js")),
    ("/ui/js/api.js", JS, include_str!("../../ui/js/api.js")),
    ("/ui/js/sse.js", JS, include_str!("../../ui/js/sse.js")),
    ("/ui/js/live.js", JS, include_str!("../../ui/js/live.js")),
    ("/ui/js/dom.js", JS, include_str!("../../ui/js/dom.js")),
    ("/ui/js/feedback.js", JS, include_str!("../../ui/js/feedback.js")),
    ("/ui/js/namespace.js", JS, include_str!("../../ui/js/namespace.js")),
    ("/ui/js/router.js", JS, include_str!("../../ui/js/router.js")),
    ("/ui/js/views/pools.js", JS, include_str!("../../ui/js/views/pools.js")),
    ("/ui/js/views/pool.js", JS, include_str!("../../ui/js/views/pool.js")),
    ("/ui/js/views/machines.js", JS, include_str!("../../ui/js/views/machines.js")),
    ("/ui/js/views/events.js", JS, include_str!("../../ui/js/views/events.js")),
    ("/ui/js/views/engines.js", JS, include_str!("../../ui/js/views/engines.js")),
    ("/ui/js/views/upgrades.js", JS, include_str!("../../ui/js/views/upgrades.js")),
];

/// Self only: no inline script or style, no other origin, no framing. The
/// script may call the API (`connect-src 'self'`) and nothing else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

pub fn router() -> Router<AppState> {
    let page = get(|| async { asset(HTML, INDEX_HTML) });
    let mut router = Router::new().route("/ui", page.clone()).route("/ui/", page);
    for &(path, content_type, body) in ASSETS {
        router = router.route(path, get(move || async move { asset(content_type, body) }));
    }
    router
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
            // The files change with the binary; a stale script against a
            // newer API would be a confusing failure.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
