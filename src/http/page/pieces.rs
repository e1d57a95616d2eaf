//! The fleet view cut into pieces, so that its refresh sends only what changed.
//!
//! Every piece (the as-of line, a pool's card, the filters, the count, a runner's row, the
//! next-page link) is rendered on its own and named by a key and by a hash of its HTML; the
//! page holds each in its slot with both as attributes. A refresh names the hashes it shows
//! (`X-Fleet-Have`) and gets every piece in order, those it already shows sent empty, to be
//! kept; a refresh whose whole view is unchanged gets `304` through the view's `ETag` (the
//! pieces' hashes, the as-of line left out). `assets/app.js` puts the pieces in place.

use super::fleet::FleetSelection;
use super::views::{PoolCard, RunnerRow};
use askama::Template;
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// The placeholder each piece's root element carries until its hash is known.
const HASH_PLACEHOLDER: &str = "data-hash=\"-\"";

/// One piece: its key (unique in the view), the hash of its HTML, and the HTML.
#[derive(Clone, Debug)]
pub struct Piece {
    pub key: String,
    pub hash: String,
    pub html: String,
}

/// The view's pieces, slot by slot, in document order.
#[derive(Debug, Default)]
pub struct FleetBody {
    pub head: Vec<Piece>,
    pub pools: Vec<Piece>,
    pub summary: Vec<Piece>,
    pub rows: Vec<Piece>,
    pub foot: Vec<Piece>,
    /// The whole view's validator (`"…"`, as the `ETag` header carries it).
    pub etag: String,
}

#[derive(Template)]
#[template(path = "fleet_asof.html")]
struct AsOf<'a> {
    key: &'a str,
    as_of: &'a str,
}

#[derive(Template)]
#[template(path = "fleet_pool.html")]
struct PoolPiece<'a> {
    key: &'a str,
    pool: &'a PoolCard,
}

#[derive(Template)]
#[template(path = "fleet_filters.html")]
struct Filters<'a> {
    key: &'a str,
    pool_names: Vec<&'a str>,
    sel: &'a FleetSelection,
    statuses: &'a [&'static str],
}

#[derive(Template)]
#[template(path = "fleet_matched.html")]
struct Matched<'a> {
    key: &'a str,
    sel: &'a FleetSelection,
}

#[derive(Template)]
#[template(path = "fleet_row.html")]
struct Row<'a> {
    key: &'a str,
    r: &'a RunnerRow,
    can_write: bool,
    csrf: &'a str,
}

#[derive(Template)]
#[template(path = "fleet_empty.html")]
struct Empty<'a> {
    key: &'a str,
    healthy_hidden: usize,
}

#[derive(Template)]
#[template(path = "fleet_paging.html")]
struct Paging<'a> {
    key: &'a str,
    next: &'a str,
}

/// What the view shows, to be cut into pieces.
pub struct FleetParts<'a> {
    pub as_of: &'a str,
    pub pools: &'a [PoolCard],
    pub sel: &'a FleetSelection,
    pub statuses: &'a [&'static str],
    pub can_write: bool,
    pub csrf: &'a str,
}

fn piece(key: String, t: &impl Template) -> askama::Result<Piece> {
    let rendered = t.render()?;
    let digest = Sha256::digest(rendered.as_bytes());
    // 64 bits: the pieces of one view number at most a few hundred.
    let hash = hex::encode(&digest[..8]);
    let html = rendered.replacen(HASH_PLACEHOLDER, &format!("data-hash=\"{hash}\""), 1);
    Ok(Piece { key, hash, html })
}

impl FleetBody {
    pub fn render(parts: &FleetParts) -> askama::Result<FleetBody> {
        let sel = parts.sel;
        let mut body = FleetBody {
            head: vec![piece(
                "asof".into(),
                &AsOf {
                    key: "asof",
                    as_of: parts.as_of,
                },
            )?],
            ..FleetBody::default()
        };
        for pool in parts.pools {
            let key = format!("pool:{}", pool.name);
            body.pools
                .push(piece(key.clone(), &PoolPiece { key: &key, pool })?);
        }
        body.summary.push(piece(
            "filters".into(),
            &Filters {
                key: "filters",
                pool_names: parts.pools.iter().map(|p| p.name.as_str()).collect(),
                sel,
                statuses: parts.statuses,
            },
        )?);
        body.summary.push(piece(
            "matched".into(),
            &Matched {
                key: "matched",
                sel,
            },
        )?);
        for r in &sel.rows {
            let key = format!("row:{}", r.id);
            let row = Row {
                key: &key,
                r,
                can_write: parts.can_write,
                csrf: parts.csrf,
            };
            body.rows.push(piece(key.clone(), &row)?);
        }
        if sel.rows.is_empty() {
            let empty = Empty {
                key: "row:none",
                healthy_hidden: sel.healthy_hidden,
            };
            body.rows.push(piece("row:none".into(), &empty)?);
        }
        if let Some(next) = &sel.next {
            let paging = Paging {
                key: "paging",
                next,
            };
            body.foot.push(piece("paging".into(), &paging)?);
        }
        body.etag = body.validator();
        Ok(body)
    }

    /// Every piece with its slot, in document order.
    pub fn slots(&self) -> impl Iterator<Item = (&'static str, &Piece)> {
        [
            ("head", &self.head),
            ("pools", &self.pools),
            ("summary", &self.summary),
            ("rows", &self.rows),
            ("foot", &self.foot),
        ]
        .into_iter()
        .flat_map(|(name, pieces)| pieces.iter().map(move |p| (name, p)))
    }

    /// The hash of the pieces' hashes and places, without the as-of line (which changes on
    /// every render and says nothing of the fleet).
    fn validator(&self) -> String {
        let mut h = Sha256::new();
        for (slot, p) in self.slots().filter(|(_, p)| p.key != "asof") {
            h.update(slot.as_bytes());
            h.update(b"\0");
            h.update(p.hash.as_bytes());
            h.update(b"\0");
        }
        format!("\"{}\"", hex::encode(&h.finalize()[..16]))
    }

    /// The refresh's pieces: each with its slot, and whether the page already shows it (its
    /// hash is among `have`) and so is sent empty.
    pub fn refresh<'a>(&'a self, have: &HashSet<&str>) -> Vec<(&'static str, &'a Piece, bool)> {
        self.slots()
            .map(|(slot, p)| (slot, p, have.contains(p.hash.as_str())))
            .collect()
    }
}

/// The hashes an `X-Fleet-Have` header names (space-separated; anything else is ignored).
pub fn have(header: Option<&str>) -> HashSet<&str> {
    header
        .unwrap_or("")
        .split_ascii_whitespace()
        .filter(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(rows: Vec<RunnerRow>) -> FleetSelection {
        FleetSelection {
            rows,
            healthy_hidden: 3,
            matched: 1,
            next: None,
            pool: String::new(),
            status: String::new(),
            q: String::new(),
            query: String::new(),
        }
    }

    fn row(name: &str, last_seen: &str) -> RunnerRow {
        RunnerRow {
            id: format!("id-{name}"),
            name: name.into(),
            status: "probe_failed",
            last_seen: last_seen.into(),
            ..RunnerRow::default()
        }
    }

    fn body(as_of: &str, rows: Vec<RunnerRow>) -> FleetBody {
        let sel = sel(rows);
        FleetBody::render(&FleetParts {
            as_of,
            pools: &[],
            sel: &sel,
            statuses: &["healthy"],
            can_write: true,
            csrf: "c",
        })
        .unwrap()
    }

    #[test]
    fn a_refresh_sends_only_the_pieces_that_changed() {
        let before = body("10:00", vec![row("a", "1 min ago"), row("b", "1 min ago")]);
        let after = body("10:05", vec![row("a", "1 min ago"), row("b", "2 min ago")]);
        assert_ne!(before.etag, after.etag);
        let shown: Vec<&str> = before.slots().map(|(_, p)| p.hash.as_str()).collect();
        let header = shown.join(" ");
        let have = have(Some(&header));
        let sent: Vec<&str> = after
            .refresh(&have)
            .into_iter()
            .filter(|(_, _, kept)| !kept)
            .map(|(_, p, _)| p.key.as_str())
            .collect();
        assert_eq!(sent, ["asof", "row:id-b"]);
        // Each piece carries its own hash on its root element.
        let b = &after.rows[1];
        assert!(b.html.starts_with(&format!(
            "<tr class=\"runner\" data-runner=\"id-b\" data-status=\"probe_failed\" \
             data-piece=\"row:id-b\" data-hash=\"{}\"",
            b.hash
        )));
    }

    #[test]
    fn the_view_is_the_same_while_only_the_instant_moves() {
        let a = body("10:00", vec![row("a", "1 min ago")]);
        let b = body("10:05", vec![row("a", "1 min ago")]);
        assert_eq!(a.etag, b.etag);
        assert_ne!(a.head[0].hash, b.head[0].hash);
        let none = body("10:05", vec![]);
        assert_eq!(none.rows[0].key, "row:none");
        assert!(none.rows[0].html.contains("Every runner here is healthy."));
    }

    #[test]
    fn have_takes_only_hashes() {
        let h = have(Some("0123456789abcdef junk 0123456789ABCDEF <x> 01234"));
        assert_eq!(h.len(), 2);
        assert!(have(None).is_empty());
    }
}
