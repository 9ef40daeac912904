//! The queue of pending approvals, its live updates (server-sent events).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};

use broker::approval::{self, field, Approvals, State as ApprovalState};
use broker::{keys, Store};

use crate::*;

/// The pending approvals of every bridge that asks, oldest first.
pub(crate) async fn rows(app: &App) -> Result<Vec<pages::Row>, broker::Error> {
    let mut store = app.store.clone();
    let ids = approval::pending_ids(&mut store, &app.config).await?;
    let shown = [
        field::STATUS,
        field::EXPIRES_AT,
        field::SETTLED_AT,
        field::CREATED_AT,
        field::SOURCE,
        field::CHANNEL_ID,
        field::AGENT,
        field::CONTENT_BYTES,
        field::QUORUM,
        field::APPROVALS,
        field::ENTRY_ID,
    ];
    let records = Approvals::on(&mut store)
        .load_fields_many(&ids, &shown)
        .await?;
    let now = app.clock.now_secs_f64();
    let mut rows: Vec<pages::Row> = records
        .into_iter()
        .flatten()
        .filter(|r| !r.is_settled())
        .map(|r| pages::Row {
            state: r.state(now),
            record: r,
            now,
        })
        .filter(|row| row.state == ApprovalState::Pending)
        .collect();
    rows.sort_by(|a, b| {
        (a.record.created_at, &a.record.entry_id).cmp(&(b.record.created_at, &b.record.entry_id))
    });
    Ok(rows)
}

pub(crate) async fn queue(State(app): State<Shared>, headers: HeaderMap) -> Response {
    let Some(s) = app.session(&headers).await else {
        return to_login();
    };
    match rows(&app).await {
        Ok(rows) => page(
            StatusCode::OK,
            pages::queue(&s.user, &app.keys.csrf(&s), &rows),
        ),
        Err(e) => failed(e),
    }
}

pub(crate) async fn queue_fragment(State(app): State<Shared>, headers: HeaderMap) -> Response {
    if app.session(&headers).await.is_none() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    match rows(&app).await {
        Ok(rows) => Html(pages::queue_table(&rows).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

/// Server-sent events: one `changed` whenever any audit trail grows (an
/// approval parked, answered, settled).
pub(crate) async fn events(State(app): State<Shared>, headers: HeaderMap) -> Response {
    let Some(s) = app.session(&headers).await else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    // Per user first: one user's tabs (or scripts) cannot hold every stream.
    let Some(mine) = UserStream::take(&app, &s.user) else {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    };
    let Ok(permit) = app.streams.clone().try_acquire_owned() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let permit = (permit, mine);
    let streams: Vec<String> = app.config.bridges.keys().map(|b| keys::audit(b)).collect();
    // Its own connection: a blocking read would hold up everyone else's.
    let store = match Store::connect(&redis_config(&app.config)).await {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let reader = match store.blocking().await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let start = vec!["$".to_string(); streams.len()];
    // Checked again before every read (at least every 10 s): a logged-out or
    // changed-password session loses its stream too.
    let nonce = s.nonce.clone();
    let record = session_record(&s.user, &app.users.fingerprint(&s.user).unwrap_or_default());
    // The permit rides with the stream: dropped when the client goes.
    let stream = futures::stream::unfold(
        (store, reader, start, permit),
        move |(mut store, mut reader, mut last, permit)| {
            let streams = streams.clone();
            let (nonce, record) = (nonce.clone(), record.clone());
            async move {
                loop {
                    let still = store.session_record(&nonce).await;
                    if still.ok().flatten().as_deref() != Some(record.as_str()) {
                        return None;
                    }
                    let read = reader
                        .tail(&streams, &last, 100, std::time::Duration::from_secs(10))
                        .await;
                    match read {
                        Ok(batches) if batches.iter().all(|(_, e)| e.is_empty()) => continue,
                        Ok(batches) => {
                            for (s, entries) in batches {
                                if let (Some(i), Some((id, _))) =
                                    (streams.iter().position(|x| *x == s), entries.last())
                                {
                                    last[i] = id.clone();
                                }
                            }
                            let event = Event::default().data("changed");
                            return Some((
                                Ok::<_, std::convert::Infallible>(event),
                                (store, reader, last, permit),
                            ));
                        }
                        Err(_) => return None,
                    }
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
