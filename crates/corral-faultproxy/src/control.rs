//! The control API under `/_faultproxy/` on the proxy's own socket, so a
//! test in another process can change rules and read stats without a
//! second channel.
//!
//! | method | path                          | body / answer                          |
//! |--------|-------------------------------|----------------------------------------|
//! | GET    | `/_faultproxy/stats`          | [`Stats`](crate::Stats) as JSON        |
//! | POST   | `/_faultproxy/stats/reset`    | 204                                    |
//! | GET/PUT| `/_faultproxy/rules`          | list of [`Rule`](crate::Rule)s         |
//! | GET/PUT| `/_faultproxy/tracked`        | list of [`Matcher`](crate::Matcher)s   |
//! | GET/PUT| `/_faultproxy/seed`           | a non-negative integer                 |
//! | GET/PUT| `/_faultproxy/config`         | `{"seed", "rules", "tracked"}`         |
//!
//! A PUT answers 204. A bad request answers 400 with
//! `{"message": "...", "field": "rules[0].probability"}`.

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::{json, Value};

use crate::proxy::{full, json_response, ProxyBody};
use crate::rule::{parse_rules, parse_seed, parse_tracked, Config, ConfigError};
use crate::state::Shared;

/// Paths under this prefix never reach the daemon or the rules.
pub const CONTROL_PREFIX: &str = "/_faultproxy";

/// Rules files are small; this only stops a runaway client.
const MAX_BODY: usize = 1 << 20;

pub(crate) fn is_control(path: &str) -> bool {
    path.strip_prefix(CONTROL_PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

pub(crate) async fn handle(request: Request<Incoming>, shared: &Shared) -> Response<ProxyBody> {
    let (parts, body) = request.into_parts();
    let route = parts
        .uri
        .path()
        .strip_prefix(CONTROL_PREFIX)
        .unwrap_or_default()
        .trim_matches('/');
    let method = parts.method;
    let allowed: &[Method] = match route {
        "stats" => &[Method::GET],
        "stats/reset" => &[Method::POST],
        "rules" | "tracked" | "seed" | "config" => &[Method::GET, Method::PUT],
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "path",
                format!("no control endpoint {:?}", parts.uri.path()),
            )
        }
    };
    if !allowed.contains(&method) {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            format!("{method} is not allowed on {:?}", parts.uri.path()),
        );
    }

    if method == Method::GET {
        return match route {
            "stats" => ok_json(&shared.stats()),
            "rules" => ok_json(&shared.rules()),
            "tracked" => ok_json(&shared.tracked()),
            "seed" => ok_json(&shared.seed()),
            _ => ok_json(&shared.config()),
        };
    }
    if route == "stats/reset" {
        shared.reset_stats();
        return no_content();
    }

    let value = match read_json(body).await {
        Ok(value) => value,
        Err(response) => return response,
    };
    let applied = match route {
        "rules" => parse_rules(&value, "rules").map(|rules| shared.set_rules(rules)),
        "tracked" => parse_tracked(&value, "tracked").map(|tracked| shared.set_tracked(tracked)),
        "seed" => parse_seed(&value, "seed").map(|seed| shared.set_seed(seed)),
        _ => Config::from_value(&value).map(|config| {
            shared.set_seed(config.seed);
            shared.set_rules(config.rules);
            shared.set_tracked(config.tracked);
        }),
    };
    match applied {
        Ok(()) => no_content(),
        Err(ConfigError { field, reason }) => error(
            StatusCode::BAD_REQUEST,
            &field,
            format!("{field}: {reason}"),
        ),
    }
}

async fn read_json(body: Incoming) -> Result<Value, Response<ProxyBody>> {
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "(body)",
                format!("body is larger than {MAX_BODY} bytes"),
            ))
        }
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "(body)",
                format!("cannot read body: {e}"),
            ))
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "(body)",
            format!("body is not valid JSON: {e}"),
        )
    })
}

fn ok_json(value: &impl Serialize) -> Response<ProxyBody> {
    match serde_json::to_value(value) {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "(response)",
            format!("cannot render JSON: {e}"),
        ),
    }
}

fn no_content() -> Response<ProxyBody> {
    let mut response = Response::new(full(""));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

fn error(status: StatusCode, field: &str, message: String) -> Response<ProxyBody> {
    json_response(status, &json!({ "message": message, "field": field }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_prefix_and_below_is_control() {
        assert!(is_control("/_faultproxy"));
        assert!(is_control("/_faultproxy/stats"));
        assert!(!is_control("/_faultproxyx"));
        assert!(!is_control("/v1.41/_faultproxy/stats"));
        assert!(!is_control("/_ping"));
    }
}
