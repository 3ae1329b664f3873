//! Which namespaces go together: the batches of a migration, fixed when it starts.

use std::collections::BTreeSet;

/// The tag's member namespaces in batches of `batch_size`: the names of `order` that are
/// members first, in that order, then the other members sorted by name. Names in `order`
/// that are not members are skipped (a migration never restarts a namespace outside its tag);
/// a name listed twice counts once.
pub fn plan_batches(members: &[String], order: &[String], batch_size: i32) -> Vec<Vec<String>> {
    let size = usize::try_from(batch_size).unwrap_or(1).max(1);
    let members: BTreeSet<&str> = members.iter().map(String::as_str).collect();
    let mut seen = BTreeSet::new();
    let mut sequence: Vec<String> = Vec::with_capacity(members.len());
    for name in order {
        if members.contains(name.as_str()) && seen.insert(name.as_str()) {
            sequence.push(name.clone());
        }
    }
    for name in &members {
        if seen.insert(name) {
            sequence.push((*name).to_string());
        }
    }
    sequence.chunks(size).map(<[String]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn canaries_first_then_the_rest_sorted_in_batches() {
        let batches = plan_batches(
            &s(&["shop", "cart", "pay", "ads", "web"]),
            &s(&["web", "pay"]),
            2,
        );
        assert_eq!(
            batches,
            vec![s(&["web", "pay"]), s(&["ads", "cart"]), s(&["shop"])]
        );
    }

    #[test]
    fn names_outside_the_tag_and_repeats_are_skipped() {
        let batches = plan_batches(
            &s(&["cart", "shop"]),
            &s(&["other-tenant", "shop", "shop"]),
            1,
        );
        assert_eq!(batches, vec![s(&["shop"]), s(&["cart"])]);
    }

    #[test]
    fn no_members_no_batches_and_a_bad_size_means_one() {
        assert!(plan_batches(&[], &s(&["x"]), 3).is_empty());
        assert_eq!(
            plan_batches(&s(&["a", "b"]), &[], 0),
            vec![s(&["a"]), s(&["b"])]
        );
    }
}
