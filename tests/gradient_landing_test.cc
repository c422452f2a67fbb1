// GradientLanding's lending CPU allocator (worker/strategies/gradient_landing.h) as libtorch uses
// it: only inside a scope, only an allocation of a lendable place's exact size, only a place on
// c10's alignment, one tensor at a time; the place comes back when the last tensor over it goes
// (a resize_ moves the tensor out with its values), and the raw interface (context = pointer,
// one raw deleter for everything) works for lent and ordinary memory alike.
#include "worker/strategies/gradient_landing.h"

#include <cstdint>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/alignment.h>
#include <gtest/gtest.h>
#include <torch/types.h>

namespace dtrain {
namespace gradient_landing_test {

TEST(GradientLanding, LendsAlignedPlacesOfTheExactSize_InScope_OneTensorAtATime) {
  // 64-byte aligned (every CPU allocation is): place 0 at element 0 (a 16 x 16 gradient's),
  // place 1 at element 300, 1200 bytes in (not on 64), both of 256 floats.
  torch::Tensor buffer = torch::zeros({1024});
  ASSERT_EQ(reinterpret_cast<uintptr_t>(buffer.data_ptr()) % c10::gAlignment, 0u);
  GradientLanding landing({buffer.slice(0, 0, 256).view({16, 16}), buffer.slice(0, 300, 556)});
  EXPECT_TRUE(landing.Lendable(0));
  EXPECT_FALSE(landing.Lendable(1));
  const int64_t lent_before = GradientLanding::lent_total();

  torch::Tensor outside = torch::empty({256});
  EXPECT_NE(outside.data_ptr(), buffer.data_ptr()) << "lent outside a scope";
  torch::Tensor t, second, other_size, nested;
  {
    GradientLanding::Scope scope(&landing);
    {
      GradientLanding::Scope none(nullptr);  // a scope of no landing inside: nothing lent
      nested = torch::empty({256});
    }
    t = torch::full({16, 16}, 3.0f);   // the outer scope lends again
    second = torch::empty({256});      // place 0 is taken; place 1 is not lendable
    other_size = torch::empty({255});  // no place of 1020 bytes
  }
  EXPECT_NE(nested.data_ptr(), buffer.data_ptr()) << "lent inside a nested scope of none";
  EXPECT_EQ(t.data_ptr(), buffer.data_ptr());
  EXPECT_TRUE(landing.Holds(t, 0));
  EXPECT_TRUE(landing.Lent(0));
  EXPECT_FALSE(landing.Lent(1));
  EXPECT_TRUE(torch::equal(buffer.slice(0, 0, 256).view({16, 16}), t));
  EXPECT_FALSE(landing.Holds(second, 0));
  EXPECT_FALSE(landing.Holds(second, 1));
  // Place 0's memory as another shape is not the place; a held place takes no copy.
  EXPECT_FALSE(landing.Holds(t.view({256}), 0));
  EXPECT_TRUE(landing.CanPlace(0, t));
  EXPECT_FALSE(landing.CanPlace(0, second.view({16, 16})));
  EXPECT_FALSE(landing.PlaceGradient(0, second.view({16, 16})));
  EXPECT_TRUE(torch::equal(t, torch::full({16, 16}, 3.0f)));
  // A free place takes a copy (zeros for no gradient).
  EXPECT_TRUE(landing.PlaceGradient(1, torch::full({256}, 2.0f)));
  EXPECT_TRUE(torch::equal(buffer.slice(0, 300, 556), torch::full({256}, 2.0f)));
  EXPECT_TRUE(landing.PlaceGradient(1, torch::Tensor()));
  EXPECT_TRUE(torch::equal(buffer.slice(0, 300, 556), torch::zeros({256})));
  EXPECT_NE(other_size.data_ptr(), buffer.data_ptr());
  EXPECT_EQ(GradientLanding::lent_total() - lent_before, 1);

  // A view keeps the place; growing the tensor moves it to the heap with its values and gives
  // the place back.
  torch::Tensor view = t.view({256});
  t.reset();
  EXPECT_TRUE(landing.Lent(0));
  view.resize_({1000});
  EXPECT_NE(view.data_ptr(), buffer.data_ptr());
  EXPECT_TRUE(torch::equal(view.slice(0, 0, 256), torch::full({256}, 3.0f)));
  EXPECT_FALSE(landing.Lent(0));

  // The raw interface: a place lent to raw_allocate comes back through raw_deallocate, and
  // ordinary memory goes back to the allocator it came from.
  c10::Allocator* cpu = c10::GetAllocator(c10::DeviceType::CPU);
  ASSERT_NE(cpu->raw_deleter(), nullptr);
  void* raw = nullptr;
  {
    GradientLanding::Scope scope(&landing);
    raw = cpu->raw_allocate(1024);
  }
  EXPECT_EQ(raw, buffer.data_ptr());
  EXPECT_TRUE(landing.Lent(0));
  cpu->raw_deallocate(raw);
  EXPECT_FALSE(landing.Lent(0));
  void* ordinary = cpu->raw_allocate(1024);
  EXPECT_NE(ordinary, buffer.data_ptr());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ordinary) % c10::gAlignment, 0u);
  cpu->raw_deallocate(ordinary);
  EXPECT_EQ(cpu->allocate(8).get_deleter(), cpu->raw_deleter());

  // The place outlives the GradientLanding while a tensor lies over it.
  torch::Tensor kept;
  {
    GradientLanding scoped({buffer.slice(0, 512, 768)});
    GradientLanding::Scope scope(&scoped);
    kept = torch::full({256}, 5.0f);
  }
  EXPECT_EQ(kept.data_ptr(), buffer.slice(0, 512, 768).data_ptr());
  EXPECT_TRUE(torch::equal(kept, torch::full({256}, 5.0f)));
  kept.reset();
}

}  // namespace gradient_landing_test
}  // namespace dtrain
