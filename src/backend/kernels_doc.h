// The op table of docs/kernels.md, generated from the backends' registries (`deepinfer-lab
// kernels-doc`); a test checks that the checked-in table is current.
#pragma once
#include <string>

namespace dil {

// The generated block, markers included.
std::string kernels_doc_block();
// `doc` with its block between the markers replaced by kernels_doc_block(); throws dil::Error
// when `doc` has no markers.
std::string kernels_doc_update(const std::string& doc);
// The block of `doc` between the markers (markers included), empty when absent.
std::string kernels_doc_current(const std::string& doc);

}  // namespace dil
