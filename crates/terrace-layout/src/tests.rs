use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn layouts() -> Vec<Layout> {
    vec![
        Layout::Simple,
        Layout::Mirror { copies: 2 },
        Layout::Mirror { copies: 3 },
        Layout::Parity { redundancy: 1 },
        Layout::Parity { redundancy: 2 },
    ]
}

fn geometry_strategy() -> impl Strategy<Value = Geometry> {
    (0usize..5, 0u32..10, 0u32..4, 0u32..4).prop_map(|(layout, extra, interleave, slab)| {
        let layout = layouts()[layout];
        let interleave_bytes = INTERLEAVE_MIN_BYTES << interleave;
        let columns = layout.min_columns() + extra;
        Geometry::new(layout, columns, interleave_bytes, interleave_bytes << slab).unwrap()
    })
}

/// Every physical place (slot, byte in slab) of one data byte, all copies.
fn places(geometry: &Geometry, offset: u64) -> Vec<(u64, u32, u64)> {
    let location = geometry.locate(offset);
    let column = geometry.physical_column(location.row, location.data_column);
    (0..geometry.layout().copies())
        .map(|copy| {
            (
                location.extent,
                geometry.slot(column, copy),
                geometry.slab_offset(location.row, location.column_offset),
            )
        })
        .collect()
}

proptest! {
    #[test]
    fn every_byte_maps_to_one_place_per_copy_and_back(geometry in geometry_strategy(), seed in any::<u64>()) {
        let offset = seed % (geometry.extent_data_bytes() * 3);
        let places = places(&geometry, offset);
        prop_assert_eq!(places.len() as u32, geometry.layout().copies());
        let mut slots: Vec<u32> = places.iter().map(|p| p.1).collect();
        slots.sort_unstable();
        slots.dedup();
        prop_assert_eq!(slots.len() as u32, geometry.layout().copies(), "copies on distinct slots");
        for (extent, slot, in_slab) in places {
            prop_assert!(slot < geometry.slots_per_extent());
            prop_assert!(in_slab < geometry.slab_bytes());
            prop_assert_eq!(geometry.space_offset(extent, slot, in_slab), Some(offset));
        }
    }

    #[test]
    fn splitting_covers_the_request_in_order_inside_single_rows(
        geometry in geometry_strategy(), start in 0u64..1 << 24, length in 1u64..1 << 22,
    ) {
        let start = start % (geometry.extent_data_bytes() * 2);
        let mut next = start;
        for span in geometry.split_rows(start, length) {
            prop_assert_eq!(span.request_offset, next - start);
            let location = geometry.locate(next);
            prop_assert_eq!((span.extent, span.row), (location.extent, location.row));
            prop_assert!(span.row_offset + span.length <= geometry.row_data_bytes());
            let mut column_next = next;
            for piece in geometry.split_columns(span) {
                let location = geometry.locate(column_next);
                prop_assert_eq!(piece.data_column, location.data_column);
                prop_assert_eq!(piece.column_offset, location.column_offset);
                prop_assert!(piece.column_offset + piece.length <= geometry.interleave_bytes());
                prop_assert_eq!(piece.request_offset, column_next - start);
                column_next += piece.length;
            }
            next += span.length;
            prop_assert_eq!(column_next, next);
        }
        prop_assert_eq!(next, start + length);
    }
}

/// Walk every block of every slot of two extents: data blocks appear exactly
/// once per copy, and each row holds exactly `redundancy` parity blocks.
#[test]
fn extents_are_exact_partitions_of_the_space() {
    for layout in layouts() {
        for columns in layout.min_columns()..layout.min_columns() + 5 {
            let geometry = Geometry::new(layout, columns, 4096, 8 * 4096).unwrap();
            let mut seen: HashMap<u64, u32> = HashMap::new();
            let mut parity_per_row: HashMap<(u64, u64), u32> = HashMap::new();
            for extent in 0..2 {
                for slot in 0..geometry.slots_per_extent() {
                    for block in 0..geometry.slab_bytes() / BLOCK_BYTES {
                        let in_slab = block * BLOCK_BYTES;
                        match geometry.space_offset(extent, slot, in_slab) {
                            Some(offset) => *seen.entry(offset).or_default() += 1,
                            None => *parity_per_row.entry((extent, block)).or_default() += 1,
                        }
                    }
                }
            }
            let blocks = 2 * geometry.extent_data_bytes() / BLOCK_BYTES;
            assert_eq!(seen.len() as u64, blocks, "{layout} {columns}");
            assert!(seen.values().all(|&count| count == layout.copies()));
            assert!(seen
                .keys()
                .all(|offset| offset % BLOCK_BYTES == 0 && *offset < blocks * BLOCK_BYTES));
            let rows = 2 * geometry.rows_per_extent();
            if layout.parity_columns() > 0 {
                assert_eq!(parity_per_row.len() as u64, rows);
                assert!(parity_per_row
                    .values()
                    .all(|&n| n == layout.parity_columns()));
            } else {
                assert!(parity_per_row.is_empty());
            }
        }
    }
}

#[test]
fn parity_rotates_over_every_column() {
    let geometry = Geometry::new(Layout::Parity { redundancy: 2 }, 5, 4096, 1 << 20).unwrap();
    let mut p_columns: Vec<u32> = (0..5).map(|row| geometry.parity_column(row, 0)).collect();
    assert_eq!(p_columns, vec![4, 3, 2, 1, 0]);
    assert_eq!(geometry.parity_column(0, 1), 0, "Q follows P, wrapping");
    assert_eq!(geometry.physical_column(0, 0), 1);
    assert_eq!(geometry.physical_column(2, 0), 4);
    assert_eq!(geometry.physical_column(2, 2), 1);
    p_columns.sort_unstable();
    p_columns.dedup();
    assert_eq!(p_columns.len(), 5);
}

#[test]
fn geometry_rejects_bad_input() {
    let mirror = Layout::Mirror { copies: 2 };
    assert!(matches!(
        Geometry::new(Layout::Mirror { copies: 4 }, 2, 4096, 1 << 20),
        Err(LayoutError::BadCopies { copies: 4 })
    ));
    assert!(matches!(
        Geometry::new(Layout::Parity { redundancy: 3 }, 6, 4096, 1 << 20),
        Err(LayoutError::BadRedundancy { .. })
    ));
    assert!(Geometry::new(Layout::Parity { redundancy: 2 }, 3, 4096, 1 << 20).is_err());
    assert!(Geometry::new(mirror, 0, 4096, 1 << 20).is_err());
    assert!(Geometry::new(mirror, COLUMNS_MAX + 1, 4096, 1 << 20).is_err());
    for interleave in [0, 2048, 4096 + 1, 3 * 4096, 32 << 20] {
        assert!(matches!(
            Geometry::new(mirror, 2, interleave, 64 << 20),
            Err(LayoutError::BadInterleave { .. })
        ));
    }
    assert!(matches!(
        Geometry::new(mirror, 2, 1 << 20, 256 << 10),
        Err(LayoutError::BadSlab { .. })
    ));
    assert!(Geometry::new(mirror, 2, 16 << 20, 16 << 20).is_ok());
}

#[test]
fn tolerance_is_derived_from_the_layout() {
    let lost_none = |_| false;
    let mirror = Geometry::new(Layout::Mirror { copies: 3 }, 2, 4096, 8192).unwrap();
    assert_eq!(mirror.remaining_tolerance(lost_none), Some(2));
    assert_eq!(mirror.remaining_tolerance(|slot| slot == 0), Some(1));
    assert_eq!(
        mirror.remaining_tolerance(|slot| slot == 0 || slot == 3),
        Some(1)
    );
    assert_eq!(mirror.remaining_tolerance(|slot| slot < 2), Some(0));
    assert_eq!(mirror.remaining_tolerance(|slot| slot < 3), None);
    let parity = Geometry::new(Layout::Parity { redundancy: 2 }, 6, 4096, 8192).unwrap();
    assert_eq!(parity.remaining_tolerance(|slot| slot == 5), Some(1));
    assert_eq!(parity.remaining_tolerance(|slot| slot >= 4), Some(0));
    assert_eq!(parity.remaining_tolerance(|slot| slot >= 3), None);
    let simple = Geometry::new(Layout::Simple, 3, 4096, 8192).unwrap();
    assert_eq!(simple.remaining_tolerance(lost_none), Some(0));
    assert_eq!(simple.remaining_tolerance(|slot| slot == 2), None);
}

#[test]
fn columns_are_chosen_with_a_reason_and_minimums_are_named() {
    let dual = Layout::Parity { redundancy: 2 };
    let choice = choose_columns(dual, None, 11).unwrap();
    assert_eq!(choice.columns, 8);
    assert_eq!(
        choice.reason,
        ColumnsReason::AutomaticMaximum {
            usable_disks: 11,
            fit: 10
        }
    );
    // One disk is kept free for rebuilds where the layout still fits.
    let five = choose_columns(dual, None, 5).unwrap();
    assert_eq!(five.columns, 4);
    assert_eq!(
        five.reason,
        ColumnsReason::KeepingOneFree {
            width: 4,
            usable_disks: 5
        }
    );
    let four = choose_columns(dual, None, 4).unwrap();
    assert_eq!(four.columns, 4);
    assert_eq!(
        four.reason,
        ColumnsReason::TooFewToKeepOneFree { usable_disks: 4 }
    );
    assert_eq!(
        choose_columns(Layout::Mirror { copies: 2 }, None, 12)
            .unwrap()
            .columns,
        5
    );
    assert_eq!(choose_columns(Layout::Simple, None, 6).unwrap().columns, 6);
    assert_eq!(
        choose_columns(Layout::Mirror { copies: 2 }, None, 5)
            .unwrap()
            .columns,
        2
    );
    assert_eq!(
        choose_columns(Layout::Mirror { copies: 3 }, None, 11)
            .unwrap()
            .columns,
        3
    );
    let error = choose_columns(dual, None, 3).unwrap_err();
    assert_eq!(
        error,
        LayoutError::TooFewDisks {
            layout: dual,
            minimum: 4,
            available: 3
        }
    );
    assert!(error.to_string().contains("at least 4 disks"));
    for (layout, minimum) in [
        (Layout::Simple, 1),
        (Layout::Mirror { copies: 2 }, 2),
        (Layout::Mirror { copies: 3 }, 3),
        (Layout::Parity { redundancy: 1 }, 3),
        (Layout::Parity { redundancy: 2 }, 4),
    ] {
        assert_eq!(layout.min_disks(), minimum);
        assert!(choose_columns(layout, None, minimum - 1).is_err() || minimum == 1);
        assert!(choose_columns(layout, None, minimum).is_ok());
    }
    assert!(matches!(
        choose_columns(Layout::Mirror { copies: 2 }, Some(3), 5),
        Err(LayoutError::ColumnsExceedDisks { needed: 6, .. })
    ));
    assert_eq!(
        choose_columns(Layout::Simple, Some(12), 12)
            .unwrap()
            .columns,
        12
    );
}

#[test]
fn capacity_figures() {
    let geometry =
        Geometry::new(Layout::Parity { redundancy: 2 }, 8, 256 << 10, 256 << 20).unwrap();
    assert_eq!(geometry.data_columns(), 6);
    assert_eq!(geometry.row_data_bytes(), 6 * (256 << 10));
    assert_eq!(geometry.extent_data_bytes(), 6 * (256 << 20));
    assert_eq!(geometry.extents_for(10 << 30), 7);
    assert_eq!(geometry.raw_per_usable(), (8, 6));
    let mirror = Geometry::new(Layout::Mirror { copies: 2 }, 4, 256 << 10, 256 << 20).unwrap();
    assert_eq!(mirror.slots_per_extent(), 8);
    assert_eq!(
        mirror.redundancy_groups(),
        vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
    );
}

#[test]
fn only_parity_has_row_wide_redundancy_and_spreads_its_columns_over_domains() {
    let layouts = [
        (Layout::Simple, false, 1),
        (Layout::Mirror { copies: 2 }, false, 2),
        (Layout::Mirror { copies: 3 }, false, 3),
        (Layout::Parity { redundancy: 1 }, true, 3),
        (Layout::Parity { redundancy: 2 }, true, 4),
    ];
    for (layout, row_wide, group) in layouts {
        assert_eq!(layout.row_wide_redundancy(), row_wide, "{layout:?}");
        assert_eq!(layout.fault_domain_group(), group, "{layout:?}");
    }
}
