// SPDX-License-Identifier: Apache-2.0
#pragma once
// The tolerance of a comparison with eager libtorch: allclose's rtol and atol.

namespace xla_rules {

struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

}  // namespace xla_rules
