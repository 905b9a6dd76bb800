//! The pages' frame (head, navigation, logout form), the error page, and the two static files: the console's
//! script (`assets/console.js`: the live preview as the analyst types, no framework) and its style sheet. Every
//! value is written through maud, which escapes it.

use crate::sessions::Session;
use axum::http::header;
use axum::response::IntoResponse;
use maud::{DOCTYPE, Markup, html};

const SCRIPT: &str = include_str!("../assets/console.js");
const STYLE: &str = include_str!("../assets/console.css");

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · dpfusion" }
            link rel="stylesheet" href="/static/console.css";
            script src="/static/console.js" defer {}
        }
    }
}

/// A page without navigation (login, errors).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { main.narrow { (body) } }
        }
    }
}

/// A logged-in page: navigation, the analyst's name, a logout form.
pub fn page(title: &str, session: &Session, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                nav {
                    span.brand { "dpfusion" }
                    a href="/" { "Ask" }
                    a href="/budget" { "Budget" }
                    @if session.admin { a href="/owner" { "Owner" } }
                    span.who { "analyst " b #analyst { (session.analyst) } }
                    form.inline method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        button #logout type="submit" { "Log out" }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A refusal or error box: the message, what to change when the engine says, and whether it was free.
pub fn refusal(message: &str, hint: Option<&str>, free: bool) -> Markup {
    html! {
        div.refusal #refusal role="alert" {
            p.message { (message) }
            @if let Some(h) = hint { p.hint { "What to change: " (h) } }
            @if free { p.free { "Nothing was spent." } }
        }
    }
}

/// The page of a failed request.
pub fn error_page(message: &str, hint: Option<&str>) -> Markup {
    bare(
        "Error",
        html! {
            h1 { "Not answered" }
            div.refusal role="alert" {
                p.message { (message) }
                @if let Some(h) = hint { p.hint { "What to change: " (h) } }
            }
            p { a href="/" { "Back to the console" } }
        },
    )
}

/// `GET /static/console.js`.
pub async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT)
}

/// `GET /static/console.css`.
pub async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}
