//! `docs/PROTOCOL.md` states the version it describes in its title, its introduction, the
//! header table and the `VersionMismatch` row: each must be the code's.

const DOC: &str = include_str!("../../docs/PROTOCOL.md");

#[test]
fn the_document_states_the_codes_version_everywhere() {
    let v = protocol::PROTOCOL_VERSION;
    let title = DOC.lines().next().unwrap();
    assert_eq!(title, format!("# crowdtrain wire protocol, version {v}"));
    assert!(
        DOC.contains(&format!("Version {v} (this one)")),
        "the introduction's current version"
    );
    assert_eq!(
        DOC.matches("(this one)").count(),
        1,
        "one version is this one"
    );
    let header = DOC
        .lines()
        .find(|l| l.contains("protocol version, `u16`"))
        .expect("the header row");
    assert!(header.ends_with(&format!("= **{v}** |")), "{header}");
    let mismatch = DOC
        .lines()
        .find(|l| l.contains("| VersionMismatch |"))
        .expect("the error row");
    assert!(
        mismatch.contains(&format!("coordinator's ({v})")),
        "{mismatch}"
    );
}
