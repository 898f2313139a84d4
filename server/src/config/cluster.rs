//! `--role`, `--nats` and the flags that go with them, checked together.

use super::cli::{Cli, RoleChoice};
use super::error::ConfigError;
use super::{parse_duration, Mode, MAX_DURATION};
use crate::cluster::{ClusterConfig, Role};

type Checked = (Role, Option<ClusterConfig>, Option<(usize, usize)>);

pub(super) fn from_cli(cli: &Cli, mode: &Mode) -> Result<Checked, ConfigError> {
    let err = |m: &str| Err(ConfigError::Cluster(m.to_owned()));
    let role = match cli.role {
        RoleChoice::Single => Role::Single,
        RoleChoice::Edge => Role::Edge,
        RoleChoice::Root => Role::Root,
    };
    let data_part = cli.data_part.as_deref().map(data_part).transpose()?;
    let edge_timeout = match parse_duration(&cli.edge_timeout) {
        Ok(d) if !d.is_zero() && d <= MAX_DURATION => d,
        _ => {
            return Err(ConfigError::Cluster(format!(
                "--edge-timeout must be a duration such as 30s, got {}",
                cli.edge_timeout
            )))
        }
    };
    if cli.min_edges == 0 {
        return err("--min-edges must be at least 1");
    }
    if let Some(url) = &cli.public_url {
        if role != Role::Edge {
            return err("--public-url only applies to --role edge");
        }
        if !(url.starts_with("ws://") || url.starts_with("wss://")) {
            return Err(ConfigError::Cluster(format!(
                "--public-url must be a ws:// or wss:// URL, got {url:?}"
            )));
        }
    }
    if cli.store_every == 0 {
        return err("--store-every must be at least 1");
    }
    let Some(url) = cli.nats.clone() else {
        return match role {
            Role::Single if data_part.is_some() => err("--data-part only applies to --role edge"),
            Role::Single => Ok((role, None, None)),
            _ => {
                err("--role edge and --role root need --nats URL (a NATS server with JetStream on)")
            }
        };
    };
    match role {
        Role::Single => return err("--nats only applies to --role edge or --role root"),
        Role::Root if data_part.is_some() => return err("--data-part only applies to --role edge"),
        Role::Edge if !matches!(mode, Mode::Sync { .. }) => {
            return err("--role edge trains in rounds: it needs --mode sync")
        }
        _ => {}
    }
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if !valid(&cli.run) {
        return Err(ConfigError::Cluster(format!(
            "--run must be 1 to 64 letters, digits, - or _, got {:?}",
            cli.run
        )));
    }
    let name = match &cli.node_name {
        Some(name) if valid(name) => name.clone(),
        Some(name) => {
            return Err(ConfigError::Cluster(format!(
                "--node-name must be 1 to 64 letters, digits, - or _, got {name:?}"
            )))
        }
        None => default_name(role),
    };
    Ok((
        role,
        Some(ClusterConfig {
            url,
            run: cli.run.clone(),
            name,
            edge_timeout,
            min_edges: cli.min_edges,
            store_every: cli.store_every,
            public_url: cli.public_url.clone(),
        }),
        data_part,
    ))
}

/// `I/N` with 1 ≤ I ≤ N, as (I − 1, N).
fn data_part(raw: &str) -> Result<(usize, usize), ConfigError> {
    let parsed = raw.split_once('/').and_then(|(i, n)| {
        Some((
            i.trim().parse::<usize>().ok()?,
            n.trim().parse::<usize>().ok()?,
        ))
    });
    match parsed {
        Some((i, n)) if (1..=n).contains(&i) && n <= 10_000 => Ok((i - 1, n)),
        _ => Err(ConfigError::Cluster(format!(
            "--data-part must be I/N with 1 ≤ I ≤ N ≤ 10000, got {raw:?}"
        ))),
    }
}

/// The role, then a random suffix: unique among a run's processes.
fn default_name(role: Role) -> String {
    let mut bytes = [0u8; 4];
    let suffix = match getrandom::fill(&mut bytes) {
        Ok(()) => u32::from_le_bytes(bytes),
        Err(_) => std::process::id(),
    };
    let role = match role {
        Role::Edge => "edge",
        _ => "root",
    };
    format!("{role}-{suffix:08x}")
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(flags: &[&str]) -> Result<Config, String> {
        Config::from_args(["coordinator"].iter().chain(flags))
    }

    #[test]
    fn roles_need_their_flags_and_refuse_the_others() {
        let single = parse(&[]).expect("the default");
        assert_eq!(single.role, crate::cluster::Role::Single);
        assert!(single.cluster.is_none());
        let edge = parse(&[
            "--role",
            "edge",
            "--nats",
            "nats://127.0.0.1:4222",
            "--data-part",
            "2/3",
        ])
        .expect("an edge");
        assert_eq!(edge.data_part, Some((1, 3)));
        let cluster = edge.cluster.expect("a cluster");
        assert!(cluster.name.starts_with("edge-"), "{}", cluster.name);
        assert_eq!(cluster.run, "crowdtrain");
        for (flags, says) in [
            (&["--role", "edge"][..], "need --nats"),
            (
                &["--nats", "nats://x:1"][..],
                "only applies to --role edge or --role root",
            ),
            (&["--data-part", "1/2"][..], "--data-part only applies"),
            (
                &["--role", "root", "--nats", "n://x", "--data-part", "1/2"][..],
                "--data-part only applies",
            ),
            (
                &["--role", "edge", "--nats", "n://x", "--mode", "async"][..],
                "--mode sync",
            ),
            (
                &["--role", "edge", "--nats", "n://x", "--data-part", "3/2"][..],
                "I/N",
            ),
            (
                &["--role", "edge", "--nats", "n://x", "--data-part", "0/2"][..],
                "I/N",
            ),
            (
                &["--role", "edge", "--nats", "n://x", "--run", "a.b"][..],
                "--run",
            ),
            (
                &["--role", "root", "--nats", "n://x", "--node-name", "x y"][..],
                "--node-name",
            ),
            (
                &[
                    "--role",
                    "root",
                    "--nats",
                    "n://x",
                    "--edge-timeout",
                    "soon",
                ][..],
                "--edge-timeout",
            ),
        ] {
            let err = parse(flags).expect_err("refused");
            assert!(err.contains(says), "{flags:?}: {err}");
        }
    }
}
