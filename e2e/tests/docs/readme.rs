//! Reading the README: its fenced command blocks, who runs each, and which the plan covers.

use super::*;

/// A fenced block of a doc.
pub(super) struct Block {
    pub(super) doc: &'static str,
    /// The line of its opening fence (1-based).
    pub(super) line: usize,
    pub(super) lang: String,
    pub(super) body: String,
}

/// The fenced blocks of `text`.
pub(super) fn fenced(doc: &'static str, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            match open.take() {
                Some(b) => blocks.push(b),
                None => {
                    open = Some(Block {
                        doc,
                        line: i + 1,
                        lang: fence.trim().to_string(),
                        body: String::new(),
                    })
                }
            }
        } else if let Some(b) = open.as_mut() {
            b.body.push_str(line);
            b.body.push('\n');
        }
    }
    blocks
}

/// Whether a block that is not marked `sh` holds shell commands anyway (it would escape the test).
pub(super) fn looks_like_commands(body: &str) -> bool {
    body.lines().any(|l| {
        let l = l.trim_start().trim_start_matches("L$ ").trim_start_matches("M$ ");
        ["kubectl ", "helm ", "tether ", "make "]
            .iter()
            .any(|p| l.starts_with(p))
    })
}

/// The logical lines of a block: `\`-continued lines joined (newlines kept, for bash).
pub(super) fn lines(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in body.lines() {
        if line.trim().is_empty() && cur.is_empty() {
            continue;
        }
        cur.push_str(line);
        if line.trim_end().ends_with('\\') {
            cur.push('\n');
        } else {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Whose kubeconfig a line runs with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Who {
    /// The leader cluster's admin.
    Leader,
    /// A member cluster's admin.
    Member(&'static str),
    /// `alice`, a user of the leader cluster with no rights but what `tether grant` gave her.
    Alice,
}

/// The member a comment line names, if it names one of the clusters here.
pub(super) fn named_member(rest: &str) -> Option<&'static str> {
    let word = rest.split([' ', ':', ',']).next()?;
    ["east", "west"].into_iter().find(|m| *m == word)
}

/// Who a comment line (README) switches to, if it says.
pub(super) fn comment_switch(comment: &str, member: &'static str) -> Option<Who> {
    let c = comment.trim_start_matches('#').trim().to_lowercase();
    if c.starts_with("leader") {
        Some(Who::Leader)
    } else if c.starts_with("each member cluster") {
        Some(Who::Member(member))
    } else if let Some(rest) = c.strip_prefix("member ") {
        Some(Who::Member(named_member(rest).unwrap_or(member)))
    } else if c.starts_with("alice") {
        Some(Who::Alice)
    } else {
        None
    }
}

/// Read-only commands: run again while what they look at settles.
pub(super) fn read_only(cmd: &str) -> bool {
    let c = cmd.trim_start();
    [
        "kubectl get ",
        "kubectl describe ",
        "kubectl config get-contexts",
        "kubectl -n tether-system get ",
        "kubectl -n tether-system describe ",
        "kubectl -n tether-system logs ",
        "kubectl -n kube-public get ",
        "kubectl --context ",
        "tether status",
        "tether member list",
        "tether --context leader status",
        "tether --cluster ",
        "tether kubeconfig ",
    ]
    .iter()
    .any(|p| c.starts_with(p))
        && !c.contains(" create ")
}

/// The placeholders of a line that nothing filled (`<word ...>`).
pub(super) fn unfilled(cmd: &str) -> Option<String> {
    let start = cmd.find('<')?;
    let end = start + cmd[start..].find('>')?;
    let inner = &cmd[start + 1..end];
    (inner.chars().next().is_some_and(|c| c.is_ascii_alphabetic())).then(|| cmd[start..=end].to_string())
}

/// The `sh` blocks of the docs, checked against [`PLAN`], with how to treat each.
pub(super) fn planned_blocks(repo: &Path) -> Vec<(Block, How)> {
    let mut blocks = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(repo.join(doc)).expect("read doc");
        for b in fenced(doc, &text) {
            if b.lang == "sh" {
                blocks.push(b);
            } else {
                assert!(
                    !looks_like_commands(&b.body),
                    "{doc}:{}: a ```{} block holds commands: mark it ```sh so that this test runs it",
                    b.line,
                    b.lang
                );
            }
        }
    }
    let listed: Vec<String> = blocks
        .iter()
        .map(|b| format!("{}:{}: {}", b.doc, b.line, b.body.lines().next().unwrap_or("")))
        .collect();
    assert_eq!(
        blocks.len(),
        PLAN.len(),
        "the docs' sh blocks and the test's PLAN differ: add each new block to PLAN (run or skip, \
         saying why), in order. The blocks:\n{}",
        listed.join("\n")
    );
    blocks
        .into_iter()
        .zip(PLAN)
        .map(|(b, (doc, first, how))| {
            assert!(
                b.doc == *doc && b.body.trim_start().starts_with(first),
                "{}:{}: PLAN expects a block of {doc} starting `{first}` here, the doc has:\n{}",
                b.doc,
                b.line,
                b.body
            );
            (b, *how)
        })
        .collect()
}
