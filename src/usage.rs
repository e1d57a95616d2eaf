//! Settings named as the user set them: by the variable when its value came from the
//! environment, by the flag when it came from the command line.
//!
//! Every setting is both (`LEASEGATE_LISTEN` and `--listen`). clap names the flag whatever the
//! source, so a bad `LEASEGATE_LISTEN` in a systemd environment file read "invalid value for
//! '--listen <LISTEN>'", a flag nobody typed. The service's own checks name the variable,
//! which is as wrong for someone who typed the flag. One mechanism covers both, for every
//! setting: `env_error` rewords clap's errors, `Spelling` the service's.
//!
//! A variable set under a wrong name is read by nobody: `LEASEGATE_CLOCK_SKW_S=120` left the
//! skew at its default of 30 s without a word. `unknown_variables` finds every `LEASEGATE_*`
//! variable that is no setting, with the setting it is a slip of, when one is that close.

use clap::error::{ContextKind, ContextValue};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};
use std::ffi::OsString;

/// clap's error `err` reworded to name the variable, when the value at fault came from the
/// environment; `None` when the flag was typed, and clap's own words are right.
pub fn env_error(cmd: &Command, err: &clap::Error, args: &[OsString]) -> Option<String> {
    let Some(ContextValue::String(shown)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    // Built, as the parser built its own copy: an argument shows as `--listen <LISTEN>` only
    // once its command is.
    let mut cmd = cmd.clone();
    cmd.build();
    let arg = all_args(&cmd)
        .into_iter()
        .find(|a| a.get_env().is_some() && a.to_string() == *shown)?;
    if typed(args, arg) {
        return None;
    }
    let var = arg.get_env()?.to_string_lossy();
    let text = err.render().to_string();
    let reworded = text.replace(&format!("'{shown}'"), &var);
    (reworded != text).then_some(reworded)
}

/// A setting that cannot be what it says: a value out of its range, settings that contradict
/// each other, a file a setting names that cannot be read or is not what it should be. Like a
/// value that does not parse, it stops the start with exit status 64 (`EX_USAGE`), on which
/// the packaged units do not restart: trying again cannot mend it.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct UsageError(pub anyhow::Error);

impl UsageError {
    /// Whether `e` is (or was caused by) a usage error.
    pub fn is(e: &anyhow::Error) -> bool {
        e.chain().any(|c| c.is::<UsageError>())
    }
}

/// `LEASEGATE_*` names that are no setting but belong in a leasegate environment: the test
/// suite's switches (`LEASEGATE_TEST_*`, `LEASEGATE_REQUIRE_*`, `LEASEGATE_BENCH_*`), the
/// compose file's published address (`deploy/compose`) and the heartbeat unit's service to
/// restart (`deploy/systemd`, in the agent's environment file).
const NOT_SETTINGS: [&str; 5] = [
    "LEASEGATE_TEST_",
    "LEASEGATE_REQUIRE_",
    "LEASEGATE_BENCH_",
    "LEASEGATE_PUBLISH",
    "LEASEGATE_RECYCLE_UNIT",
];

/// How far (in edits) a name may be from a setting's to be taken for a slip of it.
const SLIP_EDITS: usize = 2;

/// A `LEASEGATE_*` variable that no command reads.
#[derive(Debug, PartialEq, Eq)]
pub struct UnknownVariable {
    pub name: String,
    /// The setting it is within `SLIP_EDITS` edits of: a misspelling, most likely.
    pub meant: Option<String>,
}

/// The variables among `names` that look like leasegate's (`LEASEGATE_…`) but are no
/// setting of any command of `cmd`, in the order given.
pub fn unknown_variables(
    cmd: &Command,
    names: impl IntoIterator<Item = String>,
) -> Vec<UnknownVariable> {
    let settings: Vec<String> = all_args(cmd)
        .into_iter()
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    names
        .into_iter()
        .filter(|name| name.starts_with("LEASEGATE_"))
        .filter(|name| !NOT_SETTINGS.iter().any(|not| name.starts_with(not)))
        .filter(|name| !settings.contains(name))
        .map(|name| {
            // A setting without the prefix (`DATABASE_URL`) is also met with it.
            let meant = settings
                .iter()
                .map(|s| {
                    let as_ours = if s.starts_with("LEASEGATE_") {
                        s.clone()
                    } else {
                        format!("LEASEGATE_{s}")
                    };
                    (strsim::levenshtein(&name, &as_ours), s)
                })
                .filter(|(edits, _)| *edits <= SLIP_EDITS)
                .min()
                .map(|(_, s)| s.clone());
            UnknownVariable { name, meant }
        })
        .collect()
}

/// Every argument of `cmd` and of its subcommands, however deep.
fn all_args(cmd: &Command) -> Vec<&Arg> {
    let mut args: Vec<&Arg> = cmd.get_arguments().collect();
    for sub in cmd.get_subcommands() {
        args.extend(all_args(sub));
    }
    args
}

/// Whether `arg`'s flag is on the command line (before a `--`).
fn typed(args: &[OsString], arg: &Arg) -> bool {
    let long = arg.get_long().map(|l| format!("--{l}"));
    let short = arg.get_short().map(|s| format!("-{s}"));
    args.iter()
        .skip(1)
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--")
        .any(|a| {
            long.as_ref()
                .is_some_and(|l| a == *l || a.starts_with(&format!("{l}=")))
                || short.as_ref().is_some_and(|s| a.starts_with(s.as_str()))
        })
}

/// The settings this command line gave as flags: each one's variable and its flag.
#[derive(Debug, Default)]
pub struct Spelling {
    flags: Vec<(String, String)>,
}

impl Spelling {
    /// What `matches` (parsed by `cmd`) took from the command line, down its subcommands.
    pub fn of(cmd: &Command, matches: &ArgMatches) -> Spelling {
        let mut flags = Vec::new();
        let (mut cmd, mut matches) = (cmd, matches);
        loop {
            for arg in cmd.get_arguments() {
                let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
                    continue;
                };
                if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
                    flags.push((var.to_string_lossy().into_owned(), format!("--{long}")));
                }
            }
            let Some((name, sub)) = matches.subcommand() else {
                break;
            };
            let Some(sub_cmd) = cmd.find_subcommand(name) else {
                break;
            };
            (cmd, matches) = (sub_cmd, sub);
        }
        Spelling { flags }
    }

    /// `message` with every variable that was given as a flag named as that flag. Only whole
    /// names are replaced: `LEASEGATE_ADMIN_TOKEN` is not a part of `…_TOKEN_FILE`.
    pub fn apply(&self, message: &str) -> String {
        let mut out = message.to_string();
        for (var, flag) in &self.flags {
            out = replace_word(&out, var, flag);
        }
        out
    }
}

fn replace_word(text: &str, word: &str, with: &str) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_name) || after.is_some_and(is_name) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}
