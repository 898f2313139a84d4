//! Where a setting comes from: flags over environment (`CROWDTRAIN_*`) over the `--config`
//! file (TOML) over defaults.
//!
//! Every flag `--some-flag` can be set as `CROWDTRAIN_SOME_FLAG=value` or, in the file, as
//! `some-flag = value` (or `some_flag`). Values from the environment and the file become the
//! flags they stand for, added only where no higher layer gave one, and go through the same
//! parsing and validation as typed flags. An unknown key, or a value of the wrong kind, is
//! refused with the key (and the file) named.

use std::ffi::OsString;
use std::path::Path;

use clap::{ArgAction, CommandFactory, FromArgMatches};

use super::Cli;

/// Environment variables start with this.
pub const ENV_PREFIX: &str = "CROWDTRAIN_";

/// Parses `args` as the binary would, with the environment (`env`) and the `--config` file
/// layered under the flags.
pub fn parse(
    args: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Cli, clap::Error> {
    let command = Cli::command();
    let matches = command.clone().try_get_matches_from(&args)?;
    if matches.subcommand().is_some() {
        return Cli::from_arg_matches(&matches);
    }
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
        )
    };
    let mut extra: Vec<String> = Vec::new();
    let mut from_env = Vec::new();
    for arg in command.get_arguments() {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else {
            continue;
        };
        if given(id) || matches!(long, "help" | "version") {
            continue;
        }
        let name = format!("{ENV_PREFIX}{}", long.to_uppercase().replace('-', "_"));
        if let Some(value) = env(&name) {
            push(
                &mut extra,
                long,
                is_switch(arg),
                &value,
                &format!("${name}"),
            )?;
            from_env.push(id.to_string());
        }
    }
    let config = matches
        .get_one::<std::path::PathBuf>("config")
        .cloned()
        .or_else(|| env("CROWDTRAIN_CONFIG").map(Into::into));
    if let Some(path) = config {
        let table = read(&path)?;
        for (key, value) in &table {
            let long = key.replace('_', "-");
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
                .ok_or_else(|| invalid(format!("{}: unknown key `{key}`", path.display())))?;
            let id = arg.get_id().as_str();
            if given(id) || from_env.iter().any(|e| e == id) {
                continue;
            }
            let at = format!("{}: `{key}`", path.display());
            for value in values(value).map_err(|what| invalid(format!("{at}: {what}")))? {
                push(&mut extra, &long, is_switch(arg), &value, &at)?;
            }
        }
    }
    let mut all = args;
    all.extend(extra.into_iter().map(OsString::from));
    let matches = command.try_get_matches_from(all)?;
    Cli::from_arg_matches(&matches)
}

fn is_switch(arg: &clap::Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue)
}

fn invalid(message: String) -> clap::Error {
    Cli::command().error(clap::error::ErrorKind::InvalidValue, message)
}

/// Adds `--long value` (or `--long` for a switch set to true), first checking that the value
/// parses for that flag alone, so an error names where it came from.
fn push(
    extra: &mut Vec<String>,
    long: &str,
    switch: bool,
    value: &str,
    at: &str,
) -> Result<(), clap::Error> {
    let flag = format!("--{long}");
    if switch {
        return match value {
            "true" | "1" => {
                extra.push(flag);
                Ok(())
            }
            "false" | "0" | "" => Ok(()),
            _ => Err(invalid(format!(
                "{at}: {flag} is true or false, got {value:?}"
            ))),
        };
    }
    let alone = Cli::command().try_get_matches_from(["coordinator", &flag, value]);
    if let Err(err) = alone {
        if err.kind() != clap::error::ErrorKind::MissingRequiredArgument {
            let why = err.to_string();
            let why = why
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ");
            return Err(invalid(format!("{at}: {why}")));
        }
    }
    extra.push(flag);
    extra.push(value.to_string());
    Ok(())
}

fn read(path: &Path) -> Result<toml::Table, clap::Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("--config {}: {e}", path.display())))?;
    text.parse::<toml::Table>()
        .map_err(|e| invalid(format!("--config {}: {e}", path.display())))
}

/// A TOML value as flag values: scalars as one, arrays as one each.
fn values(value: &toml::Value) -> Result<Vec<String>, String> {
    match value {
        toml::Value::String(s) => Ok(vec![s.clone()]),
        toml::Value::Integer(i) => Ok(vec![i.to_string()]),
        toml::Value::Float(f) => Ok(vec![f.to_string()]),
        toml::Value::Boolean(b) => Ok(vec![b.to_string()]),
        toml::Value::Array(items) => items
            .iter()
            .map(|v| match v {
                toml::Value::Array(_) | toml::Value::Table(_) => {
                    Err("arrays hold strings, numbers or booleans".to_string())
                }
                v => values(v).map(|mut one| one.remove(0)),
            })
            .collect(),
        toml::Value::Table(_) | toml::Value::Datetime(_) => {
            Err("expected a string, number, boolean or array".into())
        }
    }
}
