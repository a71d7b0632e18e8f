//! The order two sides run in over repeated rounds: ABBA (A then B in
//! the first round, B then A in the second, ...), over an even number of
//! rounds, so that each side goes first exactly as often as second and a
//! machine that slows down or warms up over the invocation favours neither.

/// An ABBA order was asked over an odd number of rounds.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{rounds} round(s): an ABBA order needs an even number of rounds (--repeat) so that each side \
     goes first as often as second; use {}",
    (rounds + 1).max(2)
)]
pub struct OddRounds {
    pub rounds: usize,
}

/// The two sides of each of `rounds` rounds, in the order they run.
pub fn abba<T: Copy>(a: T, b: T, rounds: usize) -> Result<Vec<[T; 2]>, OddRounds> {
    if rounds == 0 || !rounds.is_multiple_of(2) {
        return Err(OddRounds { rounds });
    }
    Ok((0..rounds)
        .map(|r| if r.is_multiple_of(2) { [a, b] } else { [b, a] })
        .collect())
}

/// How each round's sides are printed: `A B, B A, ...`.
pub fn describe<T: Copy>(order: &[[T; 2]], label: impl Fn(T) -> &'static str) -> String {
    order
        .iter()
        .map(|[x, y]| format!("{} then {}", label(*x), label(*y)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_goes_first_as_often_as_second() {
        for rounds in (2..=12).step_by(2) {
            let order = abba('A', 'B', rounds).unwrap();
            assert_eq!(order.len(), rounds);
            let a_first = order.iter().filter(|r| r[0] == 'A').count();
            let b_first = order.iter().filter(|r| r[0] == 'B').count();
            assert_eq!(
                (a_first, b_first),
                (rounds / 2, rounds / 2),
                "{rounds} rounds"
            );
            // Every round runs both, and consecutive rounds mirror each other
            // (ABBA), so neither side is always the one after a fresh start.
            for pair in order.chunks(2) {
                assert_eq!(pair[0], [pair[1][1], pair[1][0]]);
                assert_ne!(pair[0][0], pair[0][1]);
            }
        }
    }

    #[test]
    fn an_odd_number_of_rounds_is_refused() {
        for rounds in [0, 1, 3, 5, 7] {
            assert_eq!(abba('A', 'B', rounds), Err(OddRounds { rounds }));
        }
        assert_eq!(
            OddRounds { rounds: 3 }.to_string(),
            "3 round(s): an ABBA order needs an even number of rounds (--repeat) so that each side \
             goes first as often as second; use 4"
        );
    }

    #[test]
    fn describes_the_order() {
        let order = abba(1, 2, 2).unwrap();
        let label = |x: i32| if x == 1 { "ours" } else { "peer" };
        assert_eq!(describe(&order, label), "ours then peer; peer then ours");
    }
}
