//! Replica division: how many replicas each chosen cluster gets.
//!
//! - Karmada's modes: static weights, `dynamicWeight: AvailableReplicas` (requests only),
//!   Aggregated (fewest clusters by requests). They divide as Karmada does, room or not,
//!   unless the placement names its own `waterLevelLimit`: then every cluster is held at its
//!   room under it, what a full cluster cannot take goes to the others by their weights, and
//!   what fits nowhere stays unplaced (a limit the user wrote down is a limit).
//! - Orrery's water level division, by the fleet's water level over the eligible clusters:
//!   at or above the high mark, *water-filling* (each replica goes where the resulting water
//!   level is lowest, so levels end as equal as they can); at or below the low mark,
//!   *aggregation* (fill the best-scoring clusters up to the limit before opening new ones,
//!   spread minimums first); between, *score-weighted* division capped by each cluster's room.
//!   No cluster is pushed over the limit; what fits nowhere stays unplaced and is reported.
//!
//! Rounding is by largest remainder, ties to the larger weight and then to the earlier
//! (better-ranked) cluster, so the same input always gives the same output.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::Ctx;

/// Divides `total` in proportion to `weights` by largest remainder; ties go to the larger
/// weight, then to the earlier entry.
pub fn divide(total: i64, weights: &[i64]) -> Vec<i64> {
    let sum: i128 = weights.iter().map(|w| (*w).max(0) as i128).sum();
    if sum == 0 || total <= 0 {
        return vec![0; weights.len()];
    }
    let mut out: Vec<i64> = Vec::with_capacity(weights.len());
    let mut rems: Vec<(i128, i64, usize)> = Vec::with_capacity(weights.len());
    let mut given = 0i64;
    for (i, w) in weights.iter().enumerate() {
        let exact = total as i128 * (*w).max(0) as i128;
        let q = (exact / sum) as i64;
        out.push(q);
        given += q;
        rems.push((exact % sum, *w, i));
    }
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    for (_, _, i) in rems.into_iter().take((total - given) as usize) {
        out[i] += 1;
    }
    out
}

/// The candidates of a division, best-ranked first, with what each holds so far.
pub(crate) struct Shares<'c, 'a> {
    pub ctx: &'c Ctx<'a>,
    /// Fleet indexes.
    pub idx: Vec<usize>,
    pub n: Vec<i64>,
    /// Replicas that fit under the limit; `None` when unbounded.
    pub room: Vec<Option<i64>>,
    pub score: Vec<f64>,
    /// What water-filling and draining add to each level for its price
    /// ([`crate::cost::lean`]); 0 where price does not count.
    pub lean: Vec<f64>,
    /// What score-weighted division multiplies each score by for its price
    /// ([`crate::cost::thrift`]); 1 where price does not count.
    pub thrift: Vec<f64>,
}

/// Heap order for water-filling: the lowest level first, then the best score, then the
/// earlier name.
struct Fill(f64, f64, usize);

impl PartialEq for Fill {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}

impl Eq for Fill {}

impl PartialOrd for Fill {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Fill {
    /// Greater means "goes first" (the heap is a max-heap).
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0)
            .then(self.1.total_cmp(&o.1))
            .then(o.2.cmp(&self.2))
    }
}

/// Heap order for draining: the highest level first, then the worst score, then the later
/// name.
struct Drain(f64, f64, usize);

impl PartialEq for Drain {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}

impl Eq for Drain {}

impl PartialOrd for Drain {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Drain {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0
            .total_cmp(&o.0)
            .then(o.1.total_cmp(&self.1))
            .then(self.2.cmp(&o.2))
    }
}

impl Shares<'_, '_> {
    fn open(&self, j: usize) -> bool {
        self.room[j].is_none_or(|r| self.n[j] < r)
    }

    /// Water-filling: `k` replicas, each where the resulting level is lowest (ties to the
    /// better score). Returns how many were placed.
    pub fn water_fill(&mut self, k: i64) -> i64 {
        let mut heap: BinaryHeap<Fill> = (0..self.idx.len())
            .filter(|j| self.open(*j))
            .map(|j| {
                Fill(
                    self.ctx.level_after(self.idx[j], self.n[j] + 1) + self.lean[j],
                    self.score[j],
                    j,
                )
            })
            .collect();
        let mut placed = 0;
        while placed < k {
            let Some(Fill(_, _, j)) = heap.pop() else {
                break;
            };
            self.n[j] += 1;
            placed += 1;
            if self.open(j) {
                heap.push(Fill(
                    self.ctx.level_after(self.idx[j], self.n[j] + 1) + self.lean[j],
                    self.score[j],
                    j,
                ));
            }
        }
        placed
    }

    /// Takes `k` replicas away, each from where the level is highest (ties to the worse
    /// score).
    pub fn drain(&mut self, k: i64) {
        let mut heap: BinaryHeap<Drain> = (0..self.idx.len())
            .filter(|j| self.n[*j] > 0)
            .map(|j| {
                Drain(
                    self.ctx.level_after(self.idx[j], self.n[j]) + self.lean[j],
                    self.score[j],
                    j,
                )
            })
            .collect();
        let mut left = k;
        while left > 0 {
            let Some(Drain(_, _, j)) = heap.pop() else {
                break;
            };
            self.n[j] -= 1;
            left -= 1;
            if self.n[j] > 0 {
                heap.push(Drain(
                    self.ctx.level_after(self.idx[j], self.n[j]) + self.lean[j],
                    self.score[j],
                    j,
                ));
            }
        }
    }

    /// Aggregation: one replica in each of the first `min_groups` groups, then fill in rank
    /// order up to the room.
    pub fn aggregate(&mut self, k: i64, groups: &[String], min_groups: usize) -> i64 {
        let mut placed = 0;
        let mut seen: Vec<&str> = Vec::new();
        for j in 0..self.idx.len() {
            if seen.len() >= min_groups || placed >= k {
                break;
            }
            let g = groups[j].as_str();
            if seen.contains(&g) {
                continue;
            }
            let has = (0..self.idx.len()).any(|x| groups[x] == g && self.n[x] > 0);
            if has {
                seen.push(g);
            } else if self.open(j) {
                self.n[j] += 1;
                placed += 1;
                seen.push(g);
            }
        }
        for j in 0..self.idx.len() {
            if placed >= k {
                break;
            }
            let take = match self.room[j] {
                Some(r) => (r - self.n[j]).max(0).min(k - placed),
                None => k - placed,
            };
            self.n[j] += take;
            placed += take;
        }
        placed
    }

    /// Score-weighted: `k` replicas in proportion to the scores, capped by room; what a full
    /// cluster cannot take goes to the others in the same proportion.
    pub fn by_score(&mut self, k: i64) -> i64 {
        let mut placed = 0;
        loop {
            let open: Vec<usize> = (0..self.idx.len()).filter(|j| self.open(*j)).collect();
            if open.is_empty() || placed >= k {
                return placed;
            }
            let weights: Vec<i64> = open
                .iter()
                .map(|j| ((self.score[*j] * self.thrift[*j] * 100.0).round() as i64).max(1))
                .collect();
            let shares = divide(k - placed, &weights);
            let mut given = 0;
            for (j, s) in open.iter().zip(shares) {
                let take = match self.room[*j] {
                    Some(r) => s.min(r - self.n[*j]),
                    None => s,
                };
                self.n[*j] += take;
                given += take;
            }
            placed += given;
            if given == 0 {
                return placed;
            }
        }
    }

    /// Adds `k` by fixed weights, room or not (Karmada's division without an explicit limit).
    pub fn by_weights(&mut self, k: i64, weights: &[i64]) {
        for (j, s) in divide(k, weights).into_iter().enumerate() {
            self.n[j] += s;
        }
    }

    /// Adds `k` by fixed weights, each cluster held at its room (an explicit
    /// `waterLevelLimit`): what a full cluster cannot take goes to the others with a weight, by
    /// their weights, until every one is full. Returns how many were placed. Where the limit
    /// holds nobody back this is exactly [`Shares::by_weights`].
    pub fn by_weights_capped(&mut self, k: i64, weights: &[i64]) -> i64 {
        let mut placed = 0;
        while placed < k {
            let open: Vec<usize> = (0..self.idx.len())
                .filter(|j| weights[*j] > 0 && self.open(*j))
                .collect();
            if open.is_empty() {
                break;
            }
            let w: Vec<i64> = open.iter().map(|j| weights[*j]).collect();
            let mut given = 0;
            for (j, s) in open.iter().zip(divide(k - placed, &w)) {
                let take = match self.room[*j] {
                    Some(r) => s.min((r - self.n[*j]).max(0)),
                    None => s,
                };
                self.n[*j] += take;
                given += take;
            }
            placed += given;
            // Each round places everything or fills a cluster; none placed means none had room.
            if given == 0 {
                break;
            }
        }
        placed
    }

    /// Takes `k` away in proportion to what each holds (Karmada's scale-down).
    pub fn shrink(&mut self, k: i64) {
        let cut = divide(k, &self.n);
        for (j, c) in cut.into_iter().enumerate() {
            self.n[j] -= c.min(self.n[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_remainder() {
        let cases: &[(i64, &[i64], &[i64])] = &[
            (1, &[1, 1, 1], &[1, 0, 0]),
            (2, &[1, 1, 1], &[1, 1, 0]),
            (10, &[1, 2, 2], &[2, 4, 4]),
            (5, &[0, 1, 0], &[0, 5, 0]),
            (4, &[0, 0], &[0, 0]),
            (7, &[3, 3, 1], &[3, 3, 1]),
            // 3/7, 15/7, 3/7: the tied remainders go to the earlier entry.
            (3, &[1, 5, 1], &[1, 2, 0]),
            (0, &[1, 1], &[0, 0]),
            (1, &[1, 2], &[0, 1]),
            (-3, &[1, 2], &[0, 0]),
            (2, &[-1, 1], &[0, 2]),
        ];
        for (total, w, want) in cases {
            let got = divide(*total, w);
            assert_eq!(got, want.to_vec(), "{total} over {w:?}");
            let positive: i64 = w.iter().map(|x| (*x).max(0)).sum();
            assert_eq!(
                got.iter().sum::<i64>(),
                if positive > 0 { (*total).max(0) } else { 0 }
            );
        }
    }
}
