// Trace strings (program path and argv, host and device names, module paths, DWARF
// function and file names) are arbitrary bytes chosen by whoever wrote the trace. Text
// output passes every one through text_safe(), so that none can move the cursor, clear a
// terminal, reorder what is shown (bidi overrides) or start a fake line in a CI log.
// JSON output is escaped by nlohmann::json instead (invalid UTF-8 replaced by U+FFFD).
#pragma once

#include <string>
#include <string_view>

namespace gpuheap {

// `s` with every byte or character that is not plain visible text written as a visible
// escape: backslash as `\\`, newline, tab and carriage return as `\n` `\t` `\r`, the other
// C0 controls, DEL and each byte of invalid UTF-8 as `\xHH`, C1 controls (U+0080–U+009F),
// bidirectional formatting characters (U+061C, U+200E/F, U+202A–U+202E, U+2066–U+2069)
// as `\uHHHH`. Valid printable UTF-8 is kept as it is. quote: also `"` as `\x22` (dump).
std::string text_safe(std::string_view s, bool quote = false);

}  // namespace gpuheap
