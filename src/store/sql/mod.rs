//! Every statement of the store, once, by concern, as plain functions over the engine
//! interface (`engine::Db`): the same functions run on SQLite and on PostgreSQL.
//!
//! - `pools`: operators' pool writes and registry resolutions;
//! - `runners`: registration, the runner record, forge runners, cordon and revocation;
//! - `jobs`: the forge's enqueue and a job's story;
//! - `queue`: the queue's order, claims, and the bench's bulk statements over it;
//! - `leases`: a lease's calls, its end by expiry or revocation, and cancels;
//! - `round`: group commit's rounds (attestations and claims), planned and written;
//! - `replay`: the recent jtis on a runner's row (rule 5);
//! - `history`: what a runner's detail shows, and refusals outside a round;
//! - `github`: the GitHub registrations leasegate minted, and their steps;
//! - `buildkite`: the Buildkite agents' pauses leasegate made, and its notes on each agent;
//! - `ejection`: job ends counted against runners, ejections and reinstatements;
//! - `sessions`: the page's sessions;
//! - `operators`: operators' named tokens;
//! - `audit`: the audit trail;
//! - `retention`: pruning past the retention horizons, one replica at a time;
//! - `samples`: pools' samples a minute, for the page's timelines;
//! - `rows`: rows into domain values.
//!
//! Below, the builders of multi-row statements that several of them share.

pub mod audit;
pub mod buildkite;
pub mod ejection;
pub mod github;
pub mod history;
pub mod jobs;
pub mod leases;
pub mod operators;
pub mod pools;
pub mod queue;
pub mod replay;
pub mod retention;
pub mod round;
pub mod rows;
pub mod runners;
pub mod samples;
pub mod sessions;

use crate::store::StoreResult;
use crate::store::engine::{Db, Param, RowsWrite};

/// `items` in slices whose lengths are powers of two, largest first (13 = 8 + 4 + 1): the
/// multi-row statements of any round then come in a few sizes that stay prepared.
pub fn chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    chunk_sizes(items.len()).map(move |size| {
        let (part, tail) = rest.split_at(size);
        rest = tail;
        part
    })
}

/// The lengths `chunks` cuts `n` items into.
pub fn chunk_sizes(n: usize) -> impl Iterator<Item = usize> {
    let mut left = n;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let size = 1usize << (usize::BITS - 1 - left.leading_zeros());
        left -= size;
        Some(size)
    })
}

/// `($1, $2, $3), ($4, $5, $6), …` for `rows` rows of `cols` parameters, numbered from
/// `first`: the VALUES list of a multi-row statement.
pub fn values_list(rows: usize, cols: usize, first: usize) -> String {
    let mut out = String::with_capacity(rows * cols * 5);
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for c in 0..cols {
            if c > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(first + r * cols + c).to_string());
        }
        out.push(')');
    }
    out
}

/// `$1, $2, …` for an `IN` list of `n` parameters numbered from `first`.
pub fn param_list(n: usize, first: usize) -> String {
    (0..n)
        .map(|i| format!("${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes `rows` with `sql(rows)` (see `RowsWrite`), each row's `cols` values bound by `bind`.
pub async fn write_rows<'r, D: Db, T>(
    db: &mut D,
    rows: &'r [T],
    cols: usize,
    sql: fn(&str) -> String,
    bind: impl Fn(&'r T) -> Vec<Param<'r>>,
) -> StoreResult<()> {
    db.write_rows(vec![RowsWrite::of(rows, cols, sql, bind)])
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_largest_first_and_cover_everything() {
        let items: Vec<usize> = (0..77).collect();
        let sizes: Vec<usize> = chunks(&items).map(<[usize]>::len).collect();
        assert_eq!(sizes, vec![64, 8, 4, 1]);
        assert_eq!(chunks(&items).flatten().copied().collect::<Vec<_>>(), items);
        assert_eq!(chunks::<u8>(&[]).count(), 0);
    }

    #[test]
    fn placeholder_lists_number_their_parameters() {
        assert_eq!(values_list(2, 3, 1), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(values_list(1, 2, 5), "($5, $6)");
        assert_eq!(param_list(3, 2), "$2, $3, $4");
    }
}
